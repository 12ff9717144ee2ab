"""Declarative pipelines on Delta: ``from autocdc import pipelines as dp``.

The same functions as ``pyspark.pipelines`` (the decorators are pyspark's own), with a
``create_auto_cdc_flow`` that takes every ``autocdc.AutoCdcFlow`` parameter: SCD type 2,
truncates, ``ignore_null_updates``, track-history lists, retention, horizon policy; and
Databricks' ``create_auto_cdc_from_snapshot_flow``, which pyspark lacks. Library files run
by ``autocdc run`` may mix both imports.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pyspark.pipelines.api import (
    append_flow,
    create_streaming_table,
    materialized_view,
    table,
    temporary_view,
)
from pyspark.pipelines.graph_element_registry import get_active_graph_element_registry
from pyspark.pipelines.source_code_location import get_caller_source_code_location
from pyspark.sql import SparkSession

from autocdc import AutoCdcFlow, AutoCdcSnapshotFlow
from autocdc.engine.snapshot import NextSnapshot

__all__ = [
    "append_flow",
    "create_auto_cdc_flow",
    "create_auto_cdc_from_snapshot_flow",
    "create_streaming_table",
    "materialized_view",
    "run",
    "table",
    "temporary_view",
]


def create_auto_cdc_flow(
    *, target: str, source: str, name: str | None = None, once: bool = False, **options: Any
) -> None:
    """Apply the change feed ``source`` (a dataset or table, read as a stream unless
    ``once``) to the streaming table ``target``; ``options`` are ``AutoCdcFlow``'s.

    The declaration is checked here, so a bad option names this line.
    """
    from autocdc.pipelines.registry import CdcFlow, where

    location = get_caller_source_code_location(stacklevel=1)
    AutoCdcFlow(target=target, name=name, **options)  # raises on a bad declaration
    get_active_graph_element_registry().register_auto_cdc_flow(
        CdcFlow(
            name=name or target,
            target=target,
            source=source,
            where=where(location),
            options=options,
            streaming=not once,
        )
    )


def create_auto_cdc_from_snapshot_flow(
    *,
    target: str,
    source: str | NextSnapshot,
    keys: list[str],
    stored_as_scd_type: int | str = 1,
    track_history_column_list: list[str] | None = None,
    track_history_except_column_list: list[str] | None = None,
    name: str | None = None,
) -> None:
    """Make the streaming table ``target`` follow full snapshots of ``source`` (AUTO CDC
    FROM SNAPSHOT): each run diffs the next snapshot against the target, so a new key is
    inserted, a changed row updated (a new version for SCD type 2) and a missing key
    deleted, at the snapshot's version.

    ``source`` is a table or view, read whole each run (its version: the Delta table's,
    else one more than the last), or a function ``next_snapshot(latest_version)`` that
    returns ``(DataFrame, version)`` or None, called until it returns None; see
    ``autocdc.AutoCdcSnapshotFlow``. The declaration is checked here, so a bad option
    names this line.
    """
    from autocdc.pipelines.registry import SnapshotFlow, where

    location = get_caller_source_code_location(stacklevel=1)
    options = {
        "keys": keys,
        "stored_as_scd_type": stored_as_scd_type,
        "track_history_column_list": track_history_column_list,
        "track_history_except_column_list": track_history_except_column_list,
    }
    options = {k: v for k, v in options.items() if v is not None}
    AutoCdcSnapshotFlow(target=target, name=name, **options)  # raises on a bad declaration
    get_active_graph_element_registry().register_auto_cdc_flow(
        SnapshotFlow(
            name=name or target,
            target=target,
            source=source,
            where=where(location),
            options=options,
        )
    )


def run(
    spec: str | Path,
    spark: SparkSession | None = None,
    *,
    full_refresh: list[str] | None = None,
    full_refresh_all: bool = False,
    refresh: list[str] | None = None,
) -> list[str]:
    """``autocdc run`` from Python (a notebook, a job): run the project of ``spec`` once
    on ``spark`` (default: ``autocdc.spark_session`` for the project's warehouse) and
    return the datasets in the order they ran."""
    from autocdc import spark_session
    from autocdc.pipelines import cli, project, runner

    loaded = project.load(Path(spec))
    spark = spark or spark_session(warehouse=loaded.warehouse, conf=loaded.configuration)
    options = runner.Options(
        full_refresh=set(full_refresh or []),
        full_refresh_all=full_refresh_all,
        refresh=None if refresh is None else set(refresh),
    )
    resolved = cli.resolve(loaded, spark, options)
    runner.Runner(spark, loaded, resolved).run(options)
    return [d.name for d in resolved.order]
