"""What every test shares: one Spark session per worker, table names, hypothesis's
profiles, and the order files run in. Helpers tests import are in tests/support."""

from __future__ import annotations

import itertools
import os

import pytest
from hypothesis import Phase, settings
from sparkconf import TEST_CONF

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

_names = itertools.count()


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
SERVER_FIXTURES = {"pg", "mariadb"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests that start servers are ``e2e`` too, tests that need no Spark session and
    start nothing are ``quick`` (``pytest -m quick``: the Spark-free tier); then files
    with ``e2e`` tests first, then files with more tests that are not quick first.

    ``make test`` runs what is not ``e2e``, ``make test-e2e`` the rest, each handing whole
    files to two workers in this order (with xdist's own reordering off): a file that takes
    minutes, started last, would leave one worker running it alone at the end.
    """
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if SERVER_FIXTURES & fixtures:
            item.add_marker(pytest.mark.e2e)
        elif "spark" not in fixtures and not item.get_closest_marker("e2e"):
            item.add_marker(pytest.mark.quick)
    files: dict[str, list[pytest.Item]] = {}
    for item in items:
        files.setdefault(item.nodeid.split("::")[0], []).append(item)

    def weight(tests: list[pytest.Item]) -> tuple[bool, int, int]:
        # A quick test takes milliseconds, one with Spark seconds: a file of 85 quick tests
        # is done in a second, so it goes last, where it fills the end of a worker's run.
        slow = sum(not t.get_closest_marker("quick") for t in tests)
        return (not any(t.get_closest_marker("e2e") for t in tests), -slow, -len(tests))

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
