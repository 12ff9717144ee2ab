"""The SQL settings the engine's own work runs under, and only it.

A micro-batch is a few rows through a dozen small queries, most of them Delta's (its log
replay, the MERGE's phases). Into a small table, generating and compiling code for the
projections outside whole-stage code cost more CPU than the rows: interpreted, a small
batch into a small table takes less time. Into a large one it is the other way round:
the MERGE runs its clauses over every row of the files it touches, slower interpreted
(docs/performance.md has the figures). So a batch whose state and changes
hold ``COMPILED_FROM_ROWS`` rows or more runs with Spark's default (:func:`fit_to_size`).
The one query that reads the whole batch before its size is known, the stage's counts,
runs compiled on a flow's first batch, which may be an initial load, and on a batch whose
source Spark estimates at ``COMPILED_FROM_BYTES`` or more (its files' size: known for a
file source, not for rows handed over from Python or a Kafka stream) (:func:`staging`).
Rows, not bytes: the state's meta counts them, which costs nothing, where a table's size
in bytes costs time every batch (Delta reconstructs the snapshot's state to sum it).
Whole-stage code generation stays on throughout.

The stage caches each batch (it is read several times) without compressing the cache:
Spark's columnar cache compresses by default, which makes caching a large batch much
slower; the cache lives for one batch.

Only for the engine's queries, not as a session default: Spark 4.2's interpreted
projections have a corner the tests found (``spark.catalog.listTables`` fails with
``EXPRESSION_DECODING_FAILED``), and a user's own queries keep Spark's defaults.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager

from py4j.protocol import Py4JJavaError
from pyspark.sql import DataFrame, SparkSession

FACTORY_MODE = "spark.sql.codegen.factoryMode"
INTERPRETED = "NO_CODEGEN"
COMPILED = "FALLBACK"  # Spark's default: compiled, interpreted where compiling fails
SETTINGS = {FACTORY_MODE: INTERPRETED, "spark.sql.inMemoryColumnarStorage.compressed": "false"}
# From this many state rows and changes on, a batch runs compiled: see above.
COMPILED_FROM_ROWS = 250_000
# From a source this large on (Spark's estimate), the stage's counts run compiled: a
# 100k-change batch (9.6 MB of Parquet) into 1M rows counts faster compiled.
COMPILED_FROM_BYTES = 4 * 1024 * 1024


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


def estimated_bytes(df: DataFrame) -> int | None:
    """Spark's estimate of ``df``'s size from its analyzed plan (no job runs), or None
    where Spark has none (it then assumes ``spark.sql.defaultSizeInBytes``) or a source
    fails to give one (the batch then runs as for an unsized source)."""
    try:
        size = int(df._jdf.queryExecution().analyzed().stats().sizeInBytes())
    except Py4JJavaError:
        return None
    unknown = df.sparkSession._jsparkSession.sessionState().conf().defaultSizeInBytes()
    return None if size >= unknown else size


def staging(
    spark: SparkSession, stored_rows: int, source_bytes: int | None
) -> AbstractContextManager[None]:
    """Inside :func:`engine_settings`, for the stage's counts (the pass that caches the
    batch before its size is known): compiled on a flow's first batch (``stored_rows``
    0), which may be an initial load of any size (interpreted, a large first batch spends
    about twice as long there), and for a source estimated at ``COMPILED_FROM_BYTES``
    or more (``source_bytes``, see :func:`estimated_bytes`); other batches keep the
    engine's setting (compiled, small batches into small tables take longer)."""
    large = source_bytes is not None and source_bytes >= COMPILED_FROM_BYTES
    return session_conf(spark, {FACTORY_MODE: COMPILED} if large or not stored_rows else {})


def fit_to_size(spark: SparkSession, rows: int) -> None:
    """Inside :func:`engine_settings`: compile again (Spark's default) when a batch
    handles ``rows`` (state rows and changes) of at least ``COMPILED_FROM_ROWS``; the
    block's end restores the session's own setting either way."""
    if rows >= COMPILED_FROM_ROWS:
        spark.conf.set(FACTORY_MODE, COMPILED)
