"""A pipeline's Delta tables read without Spark, for the commands that only read them.

``autocdc status`` and ``history`` read the event log, the targets' row counts and the
quarantine. Starting Spark for that takes tens of seconds; delta-rs (the ``deltalake``
package) reads the same tables, deletion vectors included, through its DataFusion engine
in well under a second. Tables are where the engine puts them (:func:`location`).
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable, QueryBuilder

from autocdc.runtime import has_commits


def location(warehouse: Path, name: str) -> Path | None:
    """Where the engine keeps table ``name`` (``db.table`` or ``table``): Spark's managed
    layout in the warehouse (:func:`autocdc.runtime.warehouse.default_location`). None for a
    name of another catalog (``catalog.db.table``), which only Spark can resolve."""
    parts = name.split(".")
    if len(parts) > 2:
        return None
    if len(parts) == 1 or parts[0] == "default":
        return warehouse / parts[-1]
    return warehouse / f"{parts[0]}.db" / parts[1]


def exists(path: Path | None) -> bool:
    return path is not None and has_commits(path)


def literal(value: str) -> str:
    """A SQL string literal."""
    return "'" + value.replace("'", "''") + "'"


def column(name: str) -> str:
    """A column name as DataFusion takes it (unquoted names are folded to lower case)."""
    return '"' + name.replace('"', '""') + '"'


def columns(path: Path) -> list[str]:
    return [f.name for f in DeltaTable(str(path)).schema().fields]


def query(sql: str, **tables: Path) -> list[dict[str, Any]]:
    """Rows of ``sql`` over the Delta tables given by name (as the query names them)."""
    builder = QueryBuilder()
    for name, path in tables.items():
        builder.register(name, DeltaTable(str(path)))
    return pa.table(builder.execute(sql).read_all()).to_pylist()


def micros(value: datetime | None) -> int | None:
    """Microseconds since the epoch of a stored timestamp (Spark's are UTC instants)."""
    if value is None:
        return None
    if value.tzinfo is None:
        value = value.replace(tzinfo=timezone.utc)
    delta = value - datetime(1970, 1, 1, tzinfo=timezone.utc)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
