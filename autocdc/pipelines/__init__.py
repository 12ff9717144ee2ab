"""Declarative pipelines on Delta: ``from autocdc import pipelines as dp``.

The same functions as ``pyspark.pipelines`` (the decorators are pyspark's own), with a
``create_auto_cdc_flow`` that takes every ``autocdc.AutoCdcFlow`` parameter: SCD type 2,
truncates, ``ignore_null_updates`` and partial upserts (``columns_to_update``),
track-history lists, retention, horizon policy; and ``once`` flows (backfills).
Library files run by ``autocdc run`` may mix both imports.
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

from autocdc import AutoCdcFlow

__all__ = [
    "append_flow",
    "create_auto_cdc_flow",
    "create_streaming_table",
    "materialized_view",
    "run",
    "table",
    "temporary_view",
]


def create_auto_cdc_flow(
    *, target: str, source: str, name: str | None = None, once: bool = False, **options: Any
) -> None:
    """Apply the change feed ``source`` (a dataset or table) to the streaming table
    ``target``; ``options`` are ``AutoCdcFlow``'s (``columns_to_update`` and the ignore-null
    lists for partial upserts included).

    ``once``: a backfill. ``source`` is read as one batch by the pipeline's first run, and
    again only after a full refresh of ``target``; a streaming flow into the same target
    goes on beside it. The declaration is checked here, so a bad option names this line.
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
            once=once,
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
