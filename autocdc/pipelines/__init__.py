"""Declarative pipelines on Delta: ``from autocdc import pipelines as dp``.

The same functions as ``pyspark.pipelines`` (the decorators are pyspark's own), with a
``create_auto_cdc_flow`` that takes pyspark's parameters and, keyword-only, every other
``autocdc.AutoCdcFlow`` parameter: SCD type 2,
truncates, ``ignore_null_updates`` and partial upserts (``columns_to_update``),
track-history lists, retention, horizon policy, ``once`` flows (backfills);
``create_extraction_source``, a source that queries a database table incrementally; and
Databricks' ``create_auto_cdc_from_snapshot_flow``, which pyspark lacks. Library files run
by ``autocdc run`` may mix both imports.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pyspark.pipelines.api import (
    append_flow,
    create_streaming_table,
    materialized_view,
    table,
    temporary_view,
)
from pyspark.pipelines.graph_element_registry import get_active_graph_element_registry
from pyspark.pipelines.source_code_location import get_caller_source_code_location
from pyspark.sql import Column, DataFrame, SparkSession

from autocdc.engine import (
    DEFAULT_MAX_DELETE_FRACTION,
    FlowDefinition,
    NextSnapshot,
    SnapshotDefinition,
)
from autocdc.sources.extract import Batch as ExtractionBatch
from autocdc.sources.extract import Extraction, ExtractionOptions

if TYPE_CHECKING:
    from autocdc.pipelines.declare.project import Project

__all__ = [
    "ExtractionBatch",
    "ExtractionOptions",
    "append_flow",
    "create_auto_cdc_flow",
    "create_auto_cdc_from_snapshot_flow",
    "create_debezium_source",
    "create_extraction_source",
    "create_streaming_table",
    "current",
    "current_views",
    "materialized_view",
    "run",
    "table",
    "temporary_view",
]


def create_auto_cdc_flow(
    target: str,
    source: str,
    keys: list[str],
    sequence_by: str | list[str] | Column | None = None,
    apply_as_deletes: str | Column | None = None,
    column_list: list[str] | None = None,
    except_column_list: list[str] | None = None,
    stored_as_scd_type: Literal[1, 2, "1", "2"] | None = None,
    name: str | None = None,
    *,
    once: bool = False,
    extract_options: ExtractionOptions | None = None,
    apply_as_truncates: str | Column | None = None,
    apply_as_upserts: str | Column | None = None,
    ignore_null_updates: bool = False,
    ignore_null_updates_column_list: list[str] | None = None,
    ignore_null_updates_except_column_list: list[str] | None = None,
    columns_to_update: list[str] | str | None = None,
    partial_target: bool = False,
    snapshot_target: bool = False,
    sequence_groups: dict[str, list[str]] | None = None,
    sequence_group: str | None = None,
    track_history_column_list: list[str] | None = None,
    track_history_except_column_list: list[str] | None = None,
    tombstone_retention_days: float = 7.0,
    late_beyond_horizon: Literal["quarantine", "apply"] = "quarantine",
    cluster_by: list[str] | None = None,
    table_properties: dict[str, str] | None = None,
    max_staleness: timedelta | float | str | None = None,
    max_staged_rows: int | None = None,
) -> None:
    """Apply the change feed ``source`` (a dataset or table, read as a stream unless
    ``once``; or an extraction source, read once per run) to the streaming table
    ``target``. The parameters up to ``name`` are pyspark's, in its order (so its calls
    move over unchanged; ``sequence_by`` may be left out: the feed's BigQuery-style change
    columns order it); the keyword-only ones are autocdc's, as ``autocdc.AutoCdcFlow``
    documents them (``columns_to_update`` and the ignore-null lists for partial upserts
    included). ``extract_options`` replace the extraction source's own options for this
    flow (a run's replace both).

    ``once``: a backfill. ``source`` is read as one batch by the pipeline's first run, and
    again only after a full refresh of ``target``; a streaming flow into the same target
    goes on beside it. The declaration is checked here, so a bad option names this line.
    """
    from autocdc.pipelines.declare.registry import CdcFlow, where

    location = get_caller_source_code_location(stacklevel=1)
    name = name or target  # the flow's name, kept when the run qualifies the target
    definition = FlowDefinition(  # raises on a bad declaration
        target=target,
        name=name,
        keys=keys,
        sequence_by=sequence_by,
        apply_as_deletes=apply_as_deletes,
        apply_as_truncates=apply_as_truncates,
        apply_as_upserts=apply_as_upserts,
        column_list=column_list,
        except_column_list=except_column_list,
        stored_as_scd_type=1 if stored_as_scd_type is None else stored_as_scd_type,
        ignore_null_updates=ignore_null_updates,
        ignore_null_updates_column_list=ignore_null_updates_column_list,
        ignore_null_updates_except_column_list=ignore_null_updates_except_column_list,
        columns_to_update=columns_to_update,
        partial_target=partial_target,
        snapshot_target=snapshot_target,
        sequence_groups=sequence_groups,
        sequence_group=sequence_group,
        track_history_column_list=track_history_column_list,
        track_history_except_column_list=track_history_except_column_list,
        tombstone_retention_days=tombstone_retention_days,
        late_beyond_horizon=late_beyond_horizon,
        cluster_by=cluster_by,
        table_properties=table_properties,
        max_staleness=max_staleness,
        max_staged_rows=max_staged_rows,
    )
    get_active_graph_element_registry().register_auto_cdc_flow(
        CdcFlow(
            name=name,
            target=target,
            source=source,
            where=where(location),
            definition=definition,
            streaming=not once,
            once=once,
            extract_options=extract_options,
        )
    )


def create_extraction_source(
    *, name: str, table: str, dsn: str | None = None, url: str | None = None, **options: Any
) -> None:
    """Declare ``name``, a source that queries ``table`` each run; an AUTO CDC flow reads it
    as ``source=name``. ``url``: any database, a JDBC URL (``jdbc:mariadb://host/shop``) read
    by Spark's executors, with ``user``, ``password_env`` or ``password_file``,
    ``properties`` (the driver's own) and ``partition_column`` with ``num_partitions``; or
    ``dsn``: PostgreSQL, a libpq connection string, read in the driver.

    ``options``: ``strategy`` (``"WATERMARK"``, the default, ``"CUSTOM"`` or
    ``"STATELESS"``), ``cdc_order`` (WATERMARK: column names, each optionally followed
    by ASC or DESC), ``cursor`` (CUSTOM: an object or class with the hooks ``batches``,
    ``seed``, ``fold`` and ``merge``), ``where`` (a SQL predicate: the rows in scope),
    ``partitions`` (SQL predicates, one batch each), ``columns`` (Spark DDL: the columns
    to keep and their types; default: every column, typed as the table implies),
    ``lookback`` and ``limit`` (WATERMARK: how far behind its checkpoint a run reads
    again, the rows a run reads past it) and ``options`` (:class:`ExtractionOptions`:
    concurrency, retries, staging). See docs/sources.md.

    >>> dp.create_extraction_source(  # doctest: +SKIP
    ...     name="orders_src", dsn=DSN, table="public.orders", cdc_order=["updated_at"])
    >>> dp.create_auto_cdc_flow(target="orders", source="orders_src", keys=["id"],
    ...                         sequence_by="updated_at")  # doctest: +SKIP

    The declaration is checked here (the database when the pipeline resolves).
    """
    from autocdc.pipelines.declare.registry import ExtractionSource, Registry, where
    from autocdc.pipelines.errors import PipelineDefinitionError

    location = get_caller_source_code_location(stacklevel=1)
    source = Extraction(name=name, dsn=dsn, url=url, table=table, **options)
    registry = get_active_graph_element_registry()
    if not isinstance(registry, Registry):
        raise PipelineDefinitionError(
            where=where(location),
            problem=f"extraction source `{name}` is an autocdc definition",
            hint="Run the pipeline with `autocdc run` (or dp.run).",
        )
    registry.add_extraction(ExtractionSource(source, where(location)))


def create_debezium_source(
    *,
    name: str,
    bootstrap_servers: str,
    connector: str,
    row_schema: str | None = None,
    topics: list[str] | None = None,
    topic_pattern: str | None = None,
    table: str | None = None,
    options: dict[str, str] | None = None,
    transaction_id: str | None = None,
) -> None:
    """Declare ``name``, the change rows of a Debezium connector's Kafka topics (``topics``
    by name or ``topic_pattern``, a Java regex), read from the earliest offset: what
    :func:`autocdc.debezium_kafka` returns, with no glue code. ``row_schema``: the row's
    columns as Debezium writes them (default: taken from the events' schemas when a run
    begins); ``connector``: ``"postgresql"`` or ``"mysql"``;
    ``table``: one table of a multi-table topic; ``options``: Spark's Kafka source options;
    ``transaction_id``: a column to add with each change's transaction id. An AUTO CDC
    flow reads it as ``source=name`` without ``sequence_by`` (its rows carry BigQuery-style
    change columns). See docs/sources.md.

    >>> dp.create_debezium_source(name="customer_changes", bootstrap_servers="kafka:9092",
    ...     topics=["shop.public.customers"], row_schema="id INT, name STRING",
    ...     connector="postgresql")  # doctest: +SKIP
    >>> dp.create_auto_cdc_flow(target="customers", source="customer_changes",
    ...                         keys=["id"])  # doctest: +SKIP
    """
    from autocdc.pipelines.declare.registry import Registry, where
    from autocdc.pipelines.errors import PipelineDefinitionError

    location = where(get_caller_source_code_location(stacklevel=1))
    registry = get_active_graph_element_registry()
    if not isinstance(registry, Registry):
        raise PipelineDefinitionError(
            where=location,
            problem=f"Debezium source `{name}` is an autocdc definition",
            hint="Run the pipeline with `autocdc run` (or dp.run).",
        )
    given = {
        "row_schema": row_schema,
        "topics": topics,
        "topic_pattern": topic_pattern,
        "table": table,
        "transaction_id": transaction_id,
    }
    registry.add_debezium(
        name,
        location,
        bootstrap_servers=bootstrap_servers,
        connector=connector,
        options=options,
        **{k: v for k, v in given.items() if v is not None},
    )


def create_auto_cdc_from_snapshot_flow(
    target: str,
    source: str | NextSnapshot,
    keys: list[str],
    stored_as_scd_type: Literal[1, 2, "1", "2"] = 1,
    track_history_column_list: list[str] | None = None,
    track_history_except_column_list: list[str] | None = None,
    name: str | None = None,
    *,
    max_delete_fraction: float | None = DEFAULT_MAX_DELETE_FRACTION,
    sequence_by: str | Column | None = None,
) -> None:
    """Make the streaming table ``target`` follow full snapshots of ``source`` (AUTO CDC
    FROM SNAPSHOT): each run diffs the next snapshot against the target, so a new key is
    inserted, a changed row updated (a new version for SCD type 2) and a missing key
    deleted, at the snapshot's version. The parameters up to ``name`` are Databricks', in
    its order; ``max_delete_fraction`` and ``sequence_by`` are autocdc's.

    ``source`` is a table or view, read whole each run (its version: the Delta table's,
    else one more than the last), or a function ``next_snapshot(latest_version)`` that
    returns ``(DataFrame, version)`` or None, called until it returns None; see
    ``autocdc.AutoCdcSnapshotFlow``. The declaration is checked here, so a bad option
    names this line. A snapshot that would delete more than ``max_delete_fraction`` of
    the target is refused unless the run expects it (None: no guard). ``sequence_by``:
    the snapshot's position on the clock of change flows into the same SCD type 1
    target, which it may then share with them (docs/pipelines.md).
    """
    from autocdc.pipelines.declare.registry import SnapshotFlow, where

    location = get_caller_source_code_location(stacklevel=1)
    name = name or target  # the flow's name, kept when the run qualifies the target
    definition = SnapshotDefinition(  # raises on a bad declaration
        target=target,
        name=name,
        keys=keys,
        stored_as_scd_type=stored_as_scd_type,
        track_history_column_list=track_history_column_list,
        track_history_except_column_list=track_history_except_column_list,
        max_delete_fraction=max_delete_fraction,
        sequence_by=sequence_by,
    )
    get_active_graph_element_registry().register_auto_cdc_flow(
        SnapshotFlow(
            name=name,
            target=target,
            source=source,
            where=where(location),
            definition=definition,
        )
    )


def run(
    spec: str | Path,
    spark: SparkSession | None = None,
    *,
    full_refresh: list[str] | None = None,
    full_refresh_all: bool = False,
    refresh: list[str] | None = None,
    extract_options: ExtractionOptions | None = None,
    expect_deletes: list[str] | None = None,
    replay_from: str | None = None,
) -> list[str]:
    """``autocdc run`` from Python (a notebook, a job): run the project of ``spec`` once
    on ``spark`` (default: ``autocdc.spark_session`` for the project's warehouse) and
    return the datasets in the order they ran. ``extract_options`` replace every
    extraction flow's and source's options for this run; the snapshot flows of
    ``expect_deletes`` datasets may delete beyond their ``max_delete_fraction``.
    ``replay_from``: ``"FLOW=KIND:VALUE"``, as ``autocdc run --replay-from`` takes it (that
    flow reads its source again from there; see docs/operations.md).

    Like ``autocdc run`` it holds the project's run lock (another run of the project, from
    a terminal or another notebook, is refused with ``AUTOCDC_PIPELINE_LOCKED``), and it
    leaves the session as it found it: its conf (the SQL files' ``SET`` values hold for
    the run only), current database and working folders."""
    from autocdc.pipelines.declare import project
    from autocdc.pipelines.execute import lock, pipeline, replay, runner
    from autocdc.sources import spark_session

    loaded = project.load(Path(spec))
    spark = spark or spark_session(warehouse=loaded.warehouse, conf=loaded.session_conf)
    options = runner.Options(
        full_refresh=set(full_refresh or []),
        full_refresh_all=full_refresh_all,
        refresh=None if refresh is None else set(refresh),
        extract=extract_options,
        expect_deletes=set(expect_deletes or []),
        replay_from=None if replay_from is None else replay.parse(replay_from),
    )
    with lock.hold(loaded.storage_path, loaded.name, lock.expiry_seconds(loaded)):
        ran = pipeline.execute(spark, loaded, options)
    from autocdc.pipelines.operations import fresh

    fresh.register(spark, ran.resolved)  # <table>__autocdc_current, for the notebook's SQL
    return ran.datasets


def current(
    table: str, spec: str | Path | None = None, spark: SparkSession | None = None
) -> DataFrame:
    """The live rows of dataset ``table`` of the project of ``spec`` (default: the
    ``spark-pipeline.yml`` found from the working folder) as of now: an AUTO CDC target's
    with what its flow holds staged (``max_staleness``) merged in, SCD type 2 as each
    key's open version; nothing is written and no flow is re-declared. ``spark``: default
    ``autocdc.spark_session`` for the project's warehouse."""
    from autocdc.pipelines.operations import fresh

    loaded, spark = _loaded(spec, spark)
    return fresh.current(spark, fresh.resolve(spark, loaded), table)


def current_views(
    spec: str | Path | None = None, spark: SparkSession | None = None, fresh: bool = False
) -> list[str]:
    """Register ``<table>__autocdc_current`` (:func:`current` of each AUTO CDC target) as
    temporary views for Spark SQL, and with ``fresh`` a view of each such dataset's own
    name (the whole table, staged changes merged in) that shadows the table in
    unqualified SQL; returns their names. They show the rows as of this call."""
    from autocdc.pipelines.operations import fresh as reads

    loaded, spark = _loaded(spec, spark)
    return reads.register(spark, reads.resolve(spark, loaded), fresh)


def _loaded(spec: str | Path | None, spark: SparkSession | None) -> tuple[Project, SparkSession]:
    """The project of ``spec`` (or found from the working folder), and ``spark`` or a
    session for its warehouse."""
    from autocdc.pipelines.declare import project
    from autocdc.sources import spark_session

    loaded = project.load(Path(spec) if spec else project.find_spec(Path.cwd()))
    return loaded, spark or spark_session(warehouse=loaded.warehouse, conf=loaded.session_conf)
