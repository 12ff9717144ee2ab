"""Flow retries: a flow whose work fails on an error that is not autocdc's own refusal is
started again from its checkpoint, a bounded number of times, after a growing pause,
while the other flows of the run go on (Spark Declarative Pipelines' model, and its
settings: ``spark.sql.pipelines.maxFlowRetryAttempts``, default 2, and the first and
longest pause, ``spark.sql.pipelines.execution.watchdog.minRetryTime`` / ``maxRetryTime``,
default 5 s and 1 h; the pause doubles each attempt). A flow's count starts over once
it applies a batch.

Exactly once holds across a retry as across a kill: the failed micro-batch was not
committed to the checkpoint, runs again with the same id and input, and the target's
(app id, version) pair makes a batch already applied a no-op.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from pyspark.errors import AnalysisException

from autocdc.runtime import AutoCdcError, raised_in_worker

ATTEMPTS_KEY = "spark.sql.pipelines.maxFlowRetryAttempts"
FIRST_PAUSE_KEY = "spark.sql.pipelines.execution.watchdog.minRetryTime"
LONGEST_PAUSE_KEY = "spark.sql.pipelines.execution.watchdog.maxRetryTime"
DEFAULTS = {ATTEMPTS_KEY: "2", FIRST_PAUSE_KEY: "5s", LONGEST_PAUSE_KEY: "3600s"}
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "": 1.0}


def seconds(value: str) -> float:
    """A Spark time setting (``5s``, ``500ms``, ``2m``, ``1h``, or plain seconds)."""
    found = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|min|h|)\s*", value.lower())
    if found is None:
        raise ValueError(f"{value!r} is not a duration (write e.g. 5s, 500ms, 2m)")
    return float(found.group(1)) * _UNITS[found.group(2)]


def retryable(error: BaseException) -> bool:
    """Worth another attempt: an exception (not Ctrl-C or an exit) that is neither one of
    autocdc's own refusals, raised here or in a Python worker, nor Spark's refusal of a
    query (``AnalysisException``: a missing table or column, a syntax error), which a
    retry would only repeat."""
    if not isinstance(error, Exception) or isinstance(error, (AutoCdcError, AnalysisException)):
        return False
    return raised_in_worker(error) is None


@dataclass
class Retries:
    """The run's retry policy and each flow's failures since it last applied a batch."""

    attempts: int = 2
    first_pause: float = 5.0
    longest_pause: float = 3600.0
    failures: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, conf: dict[str, str]) -> Retries:
        """The policy the run's settings give (``conf``: the session's, by key)."""
        said = {key: conf.get(key) or default for key, default in DEFAULTS.items()}
        return cls(
            attempts=int(said[ATTEMPTS_KEY]),
            first_pause=seconds(said[FIRST_PAUSE_KEY]),
            longest_pause=seconds(said[LONGEST_PAUSE_KEY]),
        )

    def next(self, flow: str, error: BaseException) -> tuple[int, float] | None:
        """The attempt ``flow`` makes next after ``error`` and the pause before it; None:
        not retryable, or out of attempts (the run fails)."""
        if not retryable(error):
            return None
        failed = self.failures.get(flow, 0) + 1
        if failed > self.attempts:
            return None
        self.failures[flow] = failed
        pause = min(self.first_pause * 2 ** (failed - 1), self.longest_pause)
        return failed, pause

    def succeeded(self, flow: str) -> None:
        self.failures.pop(flow, None)
