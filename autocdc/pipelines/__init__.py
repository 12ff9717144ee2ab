"""Declarative pipelines on Delta: ``from autocdc import pipelines as dp``.

The same functions as ``pyspark.pipelines`` (the decorators are pyspark's own), with a
``create_auto_cdc_flow`` that takes every ``autocdc.AutoCdcFlow`` parameter: SCD type 2,
truncates, ``ignore_null_updates``, track-history lists, retention, horizon policy.
Library files run by ``autocdc run`` may mix both imports.
"""

from __future__ import annotations

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

from autocdc.engine.flow import AutoCdcFlow

__all__ = [
    "append_flow",
    "create_auto_cdc_flow",
    "create_streaming_table",
    "materialized_view",
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
