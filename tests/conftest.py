from __future__ import annotations

import itertools
import os

import pytest
from hypothesis import Phase, settings

import autocdc
from autocdc.engine import batch as engine_batch

# CI runs a fixed, bounded set of examples and does not shrink a failure (each example
# costs seconds of Spark; shrinking could take many minutes per failing test);
# AUTOCDC_HYPOTHESIS=dev explores more, and shrinks.
settings.register_profile(
    "ci",
    max_examples=2,
    deadline=None,
    derandomize=True,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
)
settings.register_profile("dev", max_examples=40, deadline=None)
settings.load_profile(os.environ.get("AUTOCDC_HYPOTHESIS", "ci"))
# Heavy explorations (more kill chains) run only with AUTOCDC_HYPOTHESIS=dev.
explore = pytest.mark.skipif(
    os.environ.get("AUTOCDC_HYPOTHESIS") != "dev", reason="exploration: AUTOCDC_HYPOTHESIS=dev"
)

TEST_CONF = {
    "spark.master": "local[2]",
    "spark.sql.shuffle.partitions": "1",
    "spark.default.parallelism": "2",
    "spark.sql.adaptive.enabled": "false",
}
# A JVM a test starts in a subprocess lives a minute or two: the client compiler alone and
# the serial collector spend about a third less CPU on its start and first batches than the
# server compiler's and G1's threads (measured: 142 -> 95 s of CPU for one start and four
# applies), which on 2 cores shared by both workers and their subprocesses is wall time.
# Not for the workers' own sessions, which live through hundreds of batches: there the
# server compiler pays off (test_scd1.py: 411 s of CPU with it, over 450 s without).
JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
SUBPROCESS_CONF = {**TEST_CONF, "spark.driver.extraJavaOptions": JVM_OPTIONS}

_names = itertools.count()


def error_tail(text: str, lines: int = 30) -> str:
    """The end of a failed process's output without the JVM's stack frames and INFO
    chatter: the Python traceback and the exceptions' messages are what a report needs."""
    kept = [
        line
        for line in text.splitlines()
        if not line.lstrip().startswith(("at ", "... ")) and " INFO " not in line
    ]
    return "\n".join(kept[-lines:])


@pytest.fixture(scope="session")
def warehouse(tmp_path_factory):
    return tmp_path_factory.mktemp("warehouse")


@pytest.fixture(scope="session")
def spark(warehouse):
    """One SparkSession for the whole run: starting Spark costs ~10 s."""
    return autocdc.spark_session(warehouse=warehouse, conf=TEST_CONF)


@pytest.fixture
def new_table():
    """A fresh target name per call, so tests share the session but not tables."""
    return lambda prefix="t": f"{prefix}_{os.getpid()}_{next(_names)}"


# A test that takes one of these fixtures starts a server: it is end to end.
SERVER_FIXTURES = {"pg"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests that start servers are ``e2e`` too; then files with ``e2e`` tests first, then
    files with more tests first.

    ``make test`` runs what is not ``e2e``, ``make test-e2e`` the rest, each handing whole
    files to two workers in this order (with xdist's own reordering off): a file that takes
    minutes, started last, would leave one worker running it alone at the end.
    """
    for item in items:
        if SERVER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.e2e)
    files: dict[str, list[pytest.Item]] = {}
    for item in items:
        files.setdefault(item.nodeid.split("::")[0], []).append(item)

    def weight(tests: list[pytest.Item]) -> tuple[bool, int]:
        return (not any(t.get_closest_marker("e2e") for t in tests), -len(tests))

    items[:] = [item for tests in sorted(files.values(), key=weight) for item in tests]


@pytest.fixture
def sole_batches(monkeypatch):
    """Whether each batch applied was folded row by row (its changes sole, nothing
    stored: ``autocdc.engine.batch.sole_changes``), in order."""
    seen: list[bool] = []
    real = engine_batch.sole_changes

    def spy(batch):
        seen.append(real(batch))
        return seen[-1]

    for strategy in ("scd1", "scd2"):
        monkeypatch.setattr(f"autocdc.engine.{strategy}.sole_changes", spy)
    return seen
