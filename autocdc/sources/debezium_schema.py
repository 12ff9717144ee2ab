"""A Debezium source's row schema, taken from its events: Kafka Connect's JSON converter
(with ``schemas.enable``, its default) sends each value as ``{"schema": ..., "payload":
...}``, and the envelope's schema describes ``before`` and ``after``.

Types map as Debezium writes the values, as a declared ``row_schema`` must (see
:func:`autocdc.debezium_changes`): a PostgreSQL timestamp is a BIGINT of epoch
microseconds, a date an INT of days, a decimal in ``precise`` mode base64 text. The schema
is the union of the sampled events' columns, in the newest event's order, so a column
dropped from the table stays (NULL from then on) and one added is taken.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    ByteType,
    DataType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructField,
    StructType,
)

from autocdc.sources.errors import DebeziumSchemaError

# Kafka Connect's schema types; bytes arrive as base64 text in JSON.
_PRIMITIVES: dict[str, DataType] = {
    "int8": ByteType(),
    "int16": ShortType(),
    "int32": IntegerType(),
    "int64": LongType(),
    "float32": FloatType(),
    "float64": DoubleType(),
    "boolean": BooleanType(),
    "string": StringType(),
    "bytes": StringType(),
}


def spark_type(schema: dict[str, Any]) -> DataType:
    """The Spark type that reads a value of Connect schema ``schema`` from JSON."""
    kind = schema.get("type")
    if kind == "struct":
        return StructType(
            [StructField(f["field"], spark_type(f)) for f in schema.get("fields") or []]
        )
    if kind == "array":
        return ArrayType(spark_type(schema["items"]))
    if kind == "map" and schema["keys"].get("type") == "string":  # a JSON object
        return MapType(StringType(), spark_type(schema["values"]))
    # Anything else (a map with other keys, an array of [key, value] pairs in JSON; a type
    # Connect may add) is kept as its JSON text.
    return _PRIMITIVES.get(kind, StringType())


def _row_of(value: bytes | str | None, table: str | None, space: str) -> StructType | None:
    """The row type of one event value; None for a tombstone, an event without a schema,
    or one of another table than ``table`` (``space`` names the source field before the
    table's name: ``schema`` for PostgreSQL, ``db`` for MySQL)."""
    try:
        event = json.loads(value) if value else None
    except ValueError:
        return None
    if not isinstance(event, dict) or not event.get("schema") or not event.get("payload"):
        return None
    source = event["payload"].get("source") or {}
    if table is not None and f"{source.get(space)}.{source.get('table')}" != table:
        return None
    fields = {f.get("field"): f for f in event["schema"].get("fields") or []}
    image = fields.get("after") or fields.get("before")
    return spark_type(image) if image and image.get("type") == "struct" else None


def row_schema_of(
    values: Iterable[bytes | str | None], connector: str, table: str | None, topics: str
) -> StructType:
    """The union of the row types of ``values`` (oldest first), in the newest's order."""
    space = "schema" if connector == "postgresql" else "db"
    values = [value for value in values if value]
    rows = [row for value in values if (row := _row_of(value, table, space)) is not None]
    if not values:
        raise DebeziumSchemaError(
            topics=topics,
            problem="they hold no events yet (run again once the connector has written its "
            "snapshot)",
        )
    if not rows:
        of = f" of table {table}" if table else ""
        raise DebeziumSchemaError(
            topics=topics, problem=f"none of their newest events{of} carries a schema"
        )
    newest, fields = rows[-1], {}
    for row in reversed(rows):
        for field in row.fields:
            fields.setdefault(field.name, field)
    return StructType([*newest.fields, *(f for n, f in fields.items() if n not in newest.names)])
