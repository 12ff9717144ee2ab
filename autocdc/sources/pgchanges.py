"""Turn decoded pgoutput messages (and snapshot rows) into change rows.

A change row is one row of :data:`CHANGES_SCHEMA`: the table, the BigQuery-style
``_CHANGE_TYPE`` (UPSERT, DELETE, TRUNCATE) and ``_CHANGE_SEQUENCE_NUMBER``, and the row's
values as a JSON object (typed JSON for numbers, booleans and json columns, strings for
the rest), so one stream can carry every table of a publication and each flow parses its
own table with its own schema (:func:`autocdc.sources.postgres.postgres_table`).

The sequence is ``<commit LSN>/<position in the transaction>`` in hex sections: ordered
section by section as numbers it is exactly the order PostgreSQL committed the changes
in. A row of the initial load gets ``<slot's consistent point>/0`` (read in the snapshot
the slot exported) or ``<high watermark>/0``: after every change its read saw, before
every change it could not see (see ``postgres``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence, Set
from dataclasses import dataclass
from itertools import islice
from typing import Any

from autocdc.engine import DELETE, TRUNCATE, UPSERT
from autocdc.sources import pgoutput as pg

CHANGES_SCHEMA = (
    "table STRING, _CHANGE_TYPE STRING, _CHANGE_SEQUENCE_NUMBER STRING, data STRING, "
    "lsn STRING, xid BIGINT, _corrupt_record STRING"
)

ChangeRow = tuple[str | None, str | None, str | None, str | None, str, int | None, str | None]
_COLUMNS = ("table", "_CHANGE_TYPE", "_CHANGE_SEQUENCE_NUMBER", "data", "lsn", "xid")
ARROW_BATCH_ROWS = 10_000  # change rows per record batch handed to Spark
# What json.dumps does with a str, without its per-call setup (a value of every change).
_string = json.encoder.encode_basestring_ascii

_NUMBERS = {20, 21, 23, 26, 700, 701, 1700}  # int8, int2, int4, oid, float4, float8, numeric
_BOOL, _JSON, _JSONB, _NUMERIC = 16, 114, 3802, 1700
_FLOAT_WORDS = {"NaN": "NaN", "Infinity": "Infinity", "-Infinity": "-Infinity"}
_DATETIMES = {1082: "DATE", 1114: "TIMESTAMP", 1184: "TIMESTAMP"}  # date, timestamp(tz)
_SPARK_TYPES = {
    _BOOL: "BOOLEAN",
    20: "BIGINT",
    21: "SMALLINT",
    23: "INT",
    26: "BIGINT",
    700: "FLOAT",
    701: "DOUBLE",
    1082: "DATE",
    1114: "TIMESTAMP_NTZ",
    1184: "TIMESTAMP",
}


def arrow_batches(rows: Iterable[ChangeRow]) -> Iterator[Any]:
    """Change rows as Arrow record batches of :data:`CHANGES_SCHEMA`. Spark takes a
    reader's record batches as they are; tuples it checks and converts value by value in
    Python, which cost the reader more than decoding the log."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    fields = [StructField(c, LongType() if c == "xid" else StringType()) for c in _COLUMNS]
    schema = to_arrow_schema(
        StructType([*fields, StructField("_corrupt_record", StringType())]), timezone="UTC"
    )
    rows = iter(rows)
    while chunk := list(islice(rows, ARROW_BATCH_ROWS)):
        columns = zip(*chunk, strict=True)
        arrays = [pa.array(c, type=f.type) for c, f in zip(columns, schema, strict=True)]
        yield pa.RecordBatch.from_arrays(arrays, schema=schema)


def json_value(text: str | None, type_oid: int) -> str:
    """One column's PostgreSQL text form as a JSON token Spark's ``from_json`` types back.

    Raises :class:`Unreadable` for a date or timestamp outside what Spark holds (BC,
    after 9999, ``infinity``): the change is quarantined with that reason, not typed to
    NULL or to another instant."""
    if text is None:
        return "null"
    if type_oid in _DATETIMES and _beyond_spark(text):
        raise Unreadable(
            f"value {text!r} is outside the range of Spark's {_DATETIMES[type_oid]} "
            "(0001-01-01 to 9999-12-31)"
        )
    if type_oid == _BOOL:  # "t" from the log, "true" from a snapshot's ::text
        return "true" if text in ("t", "true") else "false"
    if type_oid in _NUMBERS:
        return _FLOAT_WORDS.get(text, text) if type_oid != _NUMERIC else _numeric(text)
    if type_oid in (_JSON, _JSONB):
        return text
    return _string(text)


def _beyond_spark(text: str) -> bool:
    """ISO text (see ``postgres.TEXT_SETTINGS``): ``[-]infinity``, ``... BC``, or a year
    of more than four digits."""
    return text.endswith(("infinity", " BC")) or len(text.partition("-")[0]) > 4


def _numeric(text: str) -> str:
    """A numeric's NaN or infinity cannot be a decimal: a string makes it quarantined."""
    return _string(text) if text in ("NaN", "Infinity", "-Infinity") else text


def json_object(names: Sequence[str], values: Sequence[str | None], oids: Sequence[int]) -> str:
    return json_fields(name_tokens(names), values, oids)


def name_tokens(names: Sequence[str]) -> list[str]:
    """Each name as the start of a JSON field (``"name":``), made once per relation."""
    return [f"{_string(name)}:" for name in names]


def json_fields(tokens: Sequence[str], values: Sequence[str | None], oids: Sequence[int]) -> str:
    """A JSON object of ``values`` (see :func:`json_value`) under :func:`name_tokens`."""
    columns = zip(tokens, values, oids, strict=True)
    return "{" + ",".join([token + json_value(value, oid) for token, value, oid in columns]) + "}"


@dataclass
class Unreadable(Exception):
    """A change that cannot be mapped to a row: it goes to quarantine with this reason."""

    reason: str


def row_payload(
    names: Sequence[str], values: Sequence[str | None], oids: Sequence[int]
) -> tuple[str | None, str | None]:
    """A row read as text: its JSON object, or None and the corrupt record (the row's text
    and why it cannot be read), which the flows reading it quarantine."""
    try:
        return json_object(names, values, oids), None
    except Unreadable as bad:
        row = dict(zip(names, values, strict=True))
        return None, json.dumps({"reason": bad.reason, "row": row})


def snapshot_row(
    table: str, sequence: str, lsn: str, names: Sequence[str], values, oids
) -> ChangeRow:
    payload, raw = row_payload(names, values, oids)
    if payload is None:
        return (table, None, None, None, lsn, None, raw)
    return load_row(table, sequence, lsn, payload)


def load_row(table: str, sequence: str, lsn: str, payload: str) -> ChangeRow:
    """An upsert the initial load vouches for: a row the table held at ``sequence``."""
    return (table, UPSERT, sequence, payload, lsn, None, None)


def spark_type(type_oid: int, typmod: int) -> str:
    """The Spark type (DDL) that :func:`json_value`'s token of a column is typed back as:
    the type the column implies. ``timestamp`` is a TIMESTAMP_NTZ (no zone), an
    unconstrained ``numeric`` a DECIMAL(38,18); a value that does not fit is a corrupt
    record, never NULL. Types with no closer Spark type (text, uuid, json, interval,
    arrays, enums, ...) read as their text."""
    if type_oid == _NUMERIC:
        if typmod < 0:
            return "DECIMAL(38,18)"
        precision, scale = (typmod - 4) >> 16, (typmod - 4) & 0xFFFF
        return f"DECIMAL({precision},{scale})" if scale <= precision <= 38 else "STRING"
    return _SPARK_TYPES.get(type_oid, "STRING")


def key_of(row: ChangeRow, keys: Sequence[str]) -> tuple | None:
    """The key a change row sets or deletes, comparable across the snapshot and the log
    (both payloads come from :func:`json_value`); None for a row that could not be read."""
    if row[3] is None or row[1] == TRUNCATE:
        return None
    values = json.loads(row[3], parse_float=str, parse_int=str)
    return tuple(values[k] for k in keys)


@dataclass(frozen=True)
class _Shape:
    """What every change of a relation needs, worked out once per Relation message."""

    relation: pg.Relation
    names: list[str]
    oids: list[int]
    tokens: list[str]  # the names as JSON fields begin (:func:`name_tokens`)

    @classmethod
    def of(cls, relation: pg.Relation) -> _Shape:
        names = [c.name for c in relation.columns]
        return cls(relation, names, [c.type_oid for c in relation.columns], name_tokens(names))


class ChangeDecoder:
    """Reads one peek of the slot, message by message, in order.

    ``keys``: each table's key columns. ``start``/``end``: only transactions whose commit
    LSN is in ``[start, end)`` become rows (a peek starts where the slot was last advanced,
    which can be before ``start`` if a crash came between a batch and its commit).
    ``watched``: tables whose keys every decoded transaction touched are noted in
    :attr:`touched` (and truncates in :attr:`truncated`), inside the range or not: what an
    initial-load read by watermarks must not vouch for. Each touched key maps to the row it
    held before its first change here, when the log sent it (an update or delete of a
    table with ``REPLICA IDENTITY FULL``), else None: the state the read would have given.
    """

    def __init__(
        self,
        keys: Mapping[str, Sequence[str]],
        start: int,
        end: int,
        watched: Set[str] = frozenset(),
    ) -> None:
        self.keys = keys
        self.start, self.end = start, end
        self.watched = watched
        self.touched: dict[str, dict[tuple, str | None]] = {table: {} for table in watched}
        self.truncated: set[str] = set()
        self.relations: dict[int, pg.Relation] = {}
        self.shapes: dict[int, _Shape] = {}
        self.begin: pg.Begin | None = None
        self.position = 0

    def feed(self, lsn: str, data: bytes) -> Iterator[ChangeRow]:
        try:
            message = pg.decode(data)
        except pg.DecodeError as error:
            yield self._unreadable(None, lsn, str(error), data)
            return
        if isinstance(message, pg.Relation):
            self.relations[message.oid] = message
        elif isinstance(message, pg.Begin):
            self.begin, self.position = message, 0
        elif isinstance(message, pg.Commit):
            self.begin = None
        elif message is not None and self.begin is not None:
            wanted = self.start <= self.begin.commit_lsn < self.end
            if wanted or self.watched:
                for row, before in self._changes(message, lsn, data):
                    self._note(row, before)
                    if wanted:
                        yield row

    def _note(self, row: ChangeRow, before: str | None) -> None:
        table = row[0]
        if table not in self.watched:
            return
        if row[1] == TRUNCATE:
            self.truncated.add(table)
        key = key_of(row, self.keys[table])
        if key is not None:
            self.touched[table].setdefault(key, before)

    def _sequence(self) -> str:
        assert self.begin is not None
        self.position += 1
        return f"{pg.format_lsn(self.begin.commit_lsn)}/{self.position:X}"

    def _changes(
        self, message: pg.Message, lsn: str, data: bytes
    ) -> Iterator[tuple[ChangeRow, str | None]]:
        """Each change row with the row its key held before it (see :meth:`_rows`)."""
        if isinstance(message, pg.Truncate):
            sequence = self._sequence()
            for oid in message.relations:
                relation = self.relations.get(oid)
                if relation is not None and relation.qualified in self.keys:
                    yield self._row(relation.qualified, TRUNCATE, sequence, "{}", lsn), None
            return
        relation = self.relations.get(message.relation)
        if relation is None:
            yield self._unreadable(None, lsn, "change before its relation message", data), None
            return
        if relation.qualified not in self.keys:
            return
        try:
            rows = list(self._rows(relation, message))
        except Unreadable as bad:
            yield self._unreadable(relation.qualified, lsn, bad.reason, data), None
            return
        sequence = self._sequence()
        for op, payload, before in rows:
            yield self._row(relation.qualified, op, sequence, payload, lsn), before

    def _rows(
        self, relation: pg.Relation, message: pg.Message
    ) -> Iterator[tuple[str, str, str | None]]:
        """The change's (operation, payload, row before): the key's whole row before the
        change when the log sent it (``REPLICA IDENTITY FULL``), else None."""
        shape = self._shape(relation)
        names, oids = shape.names, shape.oids
        keys = list(self.keys[relation.qualified])
        old_row = _whole_row(relation, message)
        if isinstance(message, pg.Delete):
            yield DELETE, self._key_object(relation, message.old, keys, "a delete"), old_row
            return
        assert isinstance(message, pg.Insert | pg.Update)
        new = list(message.new)
        old = message.old if isinstance(message, pg.Update) else None
        for i, value in enumerate(new):
            if value is pg.UNCHANGED_TOAST:
                if old is None or old[i] is pg.UNCHANGED_TOAST:
                    raise Unreadable(
                        f"update of {relation.qualified} did not send unchanged large value "
                        f"of column {names[i]!r}: set REPLICA IDENTITY FULL on the table "
                        "so updates carry every value"
                    )
                new[i] = old[i]
        if old is not None:
            old_key = self._key_object(relation, old, keys, "an update's old row")
            if old_key != self._key_object(relation, tuple(new), keys, "an update"):
                yield DELETE, old_key, old_row  # the key changed: the old row is gone
                old_row = None  # the new key held nothing before
        yield UPSERT, json_fields(shape.tokens, new, oids), old_row

    def _shape(self, relation: pg.Relation) -> _Shape:
        shape = self.shapes.get(relation.oid)
        if shape is None or shape.relation is not relation:
            shape = self.shapes[relation.oid] = _Shape.of(relation)
        return shape

    @staticmethod
    def _key_object(relation: pg.Relation, values: pg.Values, keys: list[str], what: str) -> str:
        index = {c.name: i for i, c in enumerate(relation.columns)}
        missing = [k for k in keys if k not in index or values[index[k]] is None]
        if missing:
            raise Unreadable(
                f"{what} of {relation.qualified} does not carry key column(s) {missing}: "
                "set REPLICA IDENTITY FULL on the table (or use its primary key as keys)"
            )
        oids = [relation.columns[index[k]].type_oid for k in keys]
        return json_object(keys, [values[index[k]] for k in keys], oids)

    def _row(self, table: str, op: str, sequence: str, payload: str, lsn: str) -> ChangeRow:
        assert self.begin is not None
        return (table, op, sequence, payload, lsn, self.begin.xid, None)

    def _unreadable(self, table: str | None, lsn: str, reason: str, data: bytes) -> ChangeRow:
        """Quarantined by every flow of the table (of every table, when it is not known)."""
        raw = json.dumps({"reason": reason, "lsn": lsn, "message": bytes(data).hex()})
        xid = self.begin.xid if self.begin is not None else None
        return (table, None, None, None, lsn, xid, raw)


def _whole_row(relation: pg.Relation, message: pg.Message) -> str | None:
    """The old row of an update or delete as a payload, when the log sent all of it: a
    table with ``REPLICA IDENTITY FULL`` (else only the key, or nothing, is sent)."""
    old = getattr(message, "old", None)
    if relation.replica_identity != "f" or old is None or pg.UNCHANGED_TOAST in old:
        return None
    names = [c.name for c in relation.columns]
    try:
        return json_object(names, old, [c.type_oid for c in relation.columns])
    except Unreadable:
        return None
