"""The examples in the package's docstrings run: an example that drifts from the code fails.

Examples that need a SparkSession, a database or a broker are marked ``+SKIP`` where
they are written; the rest run here, without Spark.
"""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import autocdc

MODULES = sorted(
    info.name
    for info in pkgutil.walk_packages(autocdc.__path__, "autocdc.")
    if not info.name.endswith("__main__")
)


@pytest.mark.parametrize("name", MODULES)
def test_the_examples_in_a_module_run(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0, f"{result.failed} of {name}'s examples failed (see above)"


def test_some_examples_run_at_all() -> None:
    """A guard on the test above: if no example ran, it would pass for nothing."""
    attempted = sum(doctest.testmod(importlib.import_module(name)).attempted for name in MODULES)
    assert attempted >= 5
