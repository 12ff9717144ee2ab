"""The root of every autocdc error, and the errors of starting a session.

Each layer's errors derive from :class:`AutoCdcError` through a base of their own
(:class:`SessionError` here, ``EngineError``, ``SourceError``, ``PipelineError``), so a
caller handles one layer by catching its base. The root lives in the lowest layer because
every other layer raises its subclasses.
"""

from __future__ import annotations

import importlib
import re
from typing import Any, ClassVar


class AutoCdcError(Exception):
    """Base of every autocdc error; ``error_class`` is stable, ``params`` are its facts.

    Deliberately not a ``ValueError``: pydantic wraps those into a generic
    ``ValidationError``, and we want callers to catch the precise class.
    """

    error_class: ClassVar[str] = "AUTOCDC_ERROR"
    template: ClassVar[str] = "{detail}"

    def __init__(self, **params: Any) -> None:
        self.params = params
        super().__init__(f"[{self.error_class}] {self.template.format(**params)}")


class SessionError(AutoCdcError):
    """An error of starting a session (:mod:`autocdc.runtime`): its jars, its JVM."""


class JarsUnresolvedError(SessionError):
    error_class = "AUTOCDC_JARS_UNRESOLVED"
    template = (
        "The session's jars ({coordinate}) could not be resolved (spark-submit exited with "
        "{code}); ivy's report is in {log}. Check that Java is installed and Maven Central "
        "(repo1.maven.org) is reachable, then run `python -m autocdc.runtime.jars` again."
    )


class DeltaNotSubmittedError(SessionError):
    error_class = "AUTOCDC_DELTA_NOT_SUBMITTED"
    template = (
        "spark-submit started the JVM without Delta Lake's classes ({catalog} is not "
        "loadable), and autocdc cannot add jars to a JVM already running. Add "
        "`--packages {coordinate}` to the spark-submit command (or `--jars` with the "
        "files `python -m autocdc.runtime.jars` put in {jar_dir})."
    )


# How a Python worker's traceback names an autocdc error it raised, in the message of the
# exception Spark wraps it in (PythonException, StreamingQueryException).
_IN_WORKER = re.compile(r"^(autocdc(?:\.\w+)+)\.(\w+): \[(AUTOCDC_\w+)\] (.*)$", re.MULTILINE)
# How Spark reports an autocdc error a query raised with ``raise_error`` (its text).
_RAISED = re.compile(
    r"\[USER_RAISED_EXCEPTION\] \[(AUTOCDC_\w+)\] (.*?)(?: SQLSTATE: \w+)?$", re.MULTILINE
)


def raised_in_worker(error: BaseException) -> AutoCdcError | None:
    """The autocdc error a Python worker (a source's reader, a UDF) or a query's
    ``raise_error`` raised under ``error``, rebuilt on the driver with its class and message
    (its params stay where it was raised); ``None`` when ``error`` carries none."""
    text = str(error)
    if found := _IN_WORKER.findall(text):
        module, name, error_class, message = found[-1]
        cls = getattr(importlib.import_module(module), name, None)
    elif found := _RAISED.findall(text):
        error_class, message = found[-1]
        cls = _with_class(AutoCdcError, error_class)
    else:
        return None
    if not (isinstance(cls, type) and issubclass(cls, AutoCdcError)):
        return None
    rebuilt = cls.__new__(cls)
    Exception.__init__(rebuilt, f"[{error_class}] {message}")
    rebuilt.params = {}
    return rebuilt


def _with_class(base: type[AutoCdcError], error_class: str) -> type[AutoCdcError] | None:
    """The subclass of ``base`` (imported so far) whose ``error_class`` is ``error_class``."""
    for cls in base.__subclasses__():
        if getattr(cls, "error_class", None) == error_class:
            return cls
        if (found := _with_class(cls, error_class)) is not None:
            return found
    return None
