"""The SQL settings the engine's own work runs under, and only it.

A micro-batch is a few rows through a dozen small queries, most of them Delta's (its log
replay, the MERGE's phases). Generating and compiling code for the projections outside
whole-stage code cost more CPU than the rows: interpreted, 5 changes into a small table
took 3.1 s a batch instead of 4.2 s, and the quick benchmark's SCD1 batch 4.6 s instead
of 5.7 s (one machine, medians). Whole-stage code generation stays on.

Only for the engine's queries, not as a session default: Spark 4.2's interpreted
projections have a corner the tests found (``spark.catalog.listTables`` fails with
``EXPRESSION_DECODING_FAILED``), and a user's own queries keep Spark's defaults.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager

from pyspark.sql import SparkSession

SETTINGS = {"spark.sql.codegen.factoryMode": "NO_CODEGEN"}


@contextmanager
def session_conf(spark: SparkSession, settings: dict[str, str]) -> Iterator[None]:
    """``settings`` while the block runs, the session's own values restored after.

    Session-wide while it runs: another thread's query at that moment sees them too."""
    before = {key: spark.conf.get(key, None) for key in settings}
    for key, value in settings.items():
        spark.conf.set(key, value)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)


def engine_settings(spark: SparkSession) -> AbstractContextManager[None]:
    """``SETTINGS`` while the engine's block runs (another thread's query at that moment
    runs interpreted too, which changes its speed, not its result)."""
    return session_conf(spark, SETTINGS)
