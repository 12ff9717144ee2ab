"""Read an extraction source's batches from PostgreSQL, in the driver.

Values are read as the log-based source reads them: each column as its text, on a
connection whose settings fix that text (:data:`postgres.TEXT_SETTINGS`), turned into a
JSON object by :mod:`pgchanges` and typed by ``from_json`` (:func:`postgres.typed_columns`)
as the table implies (:func:`pgchanges.spark_type`) or as the source declares. So a
value reads the same here as through the replication slot, and one that does not fit its
type (a BC date, a numeric too wide) becomes a corrupt record the flow quarantines.

A batch is one query, in one snapshot, streamed through a server-side cursor a page at a
time: pages of a batch are sequential and never split into batches of their own.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Protocol

from autocdc.engine import crash_point
from autocdc.sources import pgchanges, postgres
from autocdc.sources.extract import Batch, Cursor, Extraction, Limit, ident, option_error


class Sink(Protocol):
    """Where a batch's rows go (:mod:`autocdc.sources.staging`)."""

    def write(self, data: list[str | None], corrupt: list[str | None]) -> None: ...


@dataclass(frozen=True)
class Table:
    """A table as the catalog describes it."""

    name: str  # schema.table
    columns: tuple[str, ...]
    oids: tuple[int, ...]
    types: tuple[str, ...]  # the Spark types the columns imply (DDL)

    def schema(self, declared: str | None = None) -> str:
        """The Spark schema rows are typed with: ``declared``, else the implied one."""
        if declared is not None:
            return declared
        return ", ".join(
            f"`{c.replace('`', '``')}` {t}" for c, t in zip(self.columns, self.types, strict=True)
        )

    def select(self, where: str) -> str:
        texts = ", ".join(f"{ident(c)}::text" for c in self.columns)
        return f"SELECT {texts} FROM {postgres.quoted(self.name)} WHERE {where}"


def describe(source: Extraction) -> Table:
    """The source's table, its ``cdc_order`` columns checked against it."""
    name = postgres.qualified(source.table)
    with postgres.connect(source.dsn, autocommit=True) as conn:
        found = postgres.table_columns(conn, name)
    if not found:
        raise option_error(
            source=source.name,
            option="table",
            problem=f"names {name}, which does not exist",
            fix="Fix the name (`schema.table`, or `table` in schema public).",
        )
    columns = tuple(c for c, _, _ in found)
    unknown = [o.column for o in source.cdc_order if o.column not in columns]
    if unknown:
        raise option_error(
            source=source.name,
            option="cdc_order",
            problem=f"names {unknown}, which {name} does not have ({list(columns)})",
            fix="Name columns of the table.",
        )
    types = tuple(pgchanges.spark_type(oid, typmod) for _, oid, typmod in found)
    return Table(name, columns, tuple(oid for _, oid, _ in found), types)


def row_values(
    payload: str | None, columns: Sequence[str], texts: Sequence[str | None], oids: Sequence[int]
) -> Mapping[str, Any]:
    """A row as a cursor's ``fold`` sees it: JSON's values (numbers as int or Decimal,
    booleans, None, a json column parsed), everything else as PostgreSQL's text (a
    timestamp in ISO form, UTC). A row that could not be read keeps the text of the
    values that could not."""
    if payload is not None:
        return json.loads(payload, parse_float=Decimal)
    values = {}
    for column, text, oid in zip(columns, texts, oids, strict=True):
        try:
            values[column] = json.loads(pgchanges.json_value(text, oid), parse_float=Decimal)
        except pgchanges.Unreadable:
            values[column] = text
    return values


def edge(source: Extraction, table: Table, limit: Limit, checkpoint: Any) -> Any:
    """Where a run with ``limit`` stops: the ``limit.rows``-th value of its column past the
    checkpoint, in the source's scope (the last one when fewer are; None when none is), as
    a row's ``fold`` sees it."""
    column, descending = limit.order.column, limit.order.descending
    beyond = limit.beyond(checkpoint).narrowed(source.where)
    query = (
        f"SELECT {'min' if descending else 'max'}(v)::text FROM (SELECT {ident(column)} AS v "
        f"FROM {postgres.quoted(table.name)} WHERE {beyond.where} "
        f"ORDER BY v {'DESC' if descending else 'ASC'} LIMIT {int(limit.rows)}) AS edge"
    )
    with postgres.connect(source.dsn, autocommit=True) as conn:
        conn.read_only = True
        (text,) = conn.execute(query, beyond.params).fetchone()
    if text is None:
        return None
    oid = table.oids[table.columns.index(column)]
    return row_values(None, [column], [text], [oid])[column]


def newest(source: Extraction, table: Table) -> dict[str, Any]:
    """Per ``cdc_order`` column, the newest value in scope (the greatest ascending, the
    least descending), as a row's ``fold`` sees it: how far the source has gone."""
    order = source.cdc_order
    if not order:
        return {}
    picks = ", ".join(f"{'min' if o.descending else 'max'}({ident(o.column)})::text" for o in order)
    where = Batch().narrowed(source.where)
    query = f"SELECT {picks} FROM {postgres.quoted(table.name)} WHERE {where.where}"
    with postgres.connect(source.dsn, autocommit=True) as conn:
        conn.read_only = True
        texts = conn.execute(query, where.params).fetchone()
    columns = [o.column for o in order]
    oids = [table.oids[table.columns.index(c)] for c in columns]
    return dict(row_values(None, columns, texts, oids))


def read_batch(
    source: Extraction,
    table: Table,
    batch: Batch,
    cursor: Cursor,
    checkpoint: Any,
    sink: Sink,
    page_rows: int,
) -> tuple[Any, int]:
    """Read ``batch`` into ``sink``; returns the batch's accumulator (its rows folded into
    ``cursor.seed(checkpoint)``) and how many rows it read."""
    folding = source.keeps_checkpoint
    acc = cursor.seed(checkpoint) if folding else None
    count = 0
    with postgres.connect(source.dsn) as conn:
        conn.read_only = True
        with conn.cursor(name="autocdc_extract") as rows:
            rows.execute(table.select(batch.where), batch.params)
            while page := rows.fetchmany(page_rows):
                data, corrupt = [], []
                for texts in page:
                    payload, raw = pgchanges.row_payload(table.columns, texts, table.oids)
                    data.append(payload)
                    corrupt.append(raw)
                    if folding:
                        values = row_values(payload, table.columns, texts, table.oids)
                        acc = cursor.fold(acc, values)
                sink.write(data, corrupt)
                count += len(page)
                crash_point("extract_mid_read")
    return acc, count
