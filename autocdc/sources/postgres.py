"""PostgreSQL log-based capture: a Spark streaming source over a logical replication slot.

``spark.readStream.format("postgres_cdc")`` with options ``dsn`` (libpq connection string),
``tables`` (comma-separated, ``schema.table`` or ``table`` for ``public``), ``slot``
(default ``autocdc``), ``publication`` (default: the slot's name; created for the tables
when missing) and ``keys.<schema.table>`` for a table without a primary key.

Offsets are LSNs. The first batch is the initial load: the slot is created with an
exported snapshot, and every table is read as of that snapshot (sequence ``0/0/0``, below
every streamed change). Each later batch peeks the changes of the transactions that
committed in ``[start, end)`` without consuming them; :meth:`commit`, called by Spark only
after the batch is written, advances the slot. A crash therefore replays a batch, never
loses one. One streaming query reads one slot: to feed several targets, append the
changes to a table and have each flow read its own table's rows from it
(:func:`postgres_table`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.types import StructType, _parse_datatype_string

from autocdc.sources import pgchanges
from autocdc.sources import pgoutput as pg
from autocdc.sources.errors import (
    NoPrimaryKeyError,
    ReplicaIdentityError,
    SnapshotLostError,
    SourceOptionError,
    TableNotFoundError,
    UnknownKeyColumnError,
    WalLevelError,
)

NAME = "postgres_cdc"
START = {"lsn": "0/0"}  # before the initial load
_PEEK = (
    "SELECT lsn::text, data FROM pg_logical_slot_peek_binary_changes("
    "%s, %s::pg_lsn, NULL, 'proto_version', '1', 'publication_names', %s)"
)
_COMMIT_ATTEMPTS = 10
# The settings that shape a value's text, fixed for every connection (the snapshot's
# ::text and the log's values are rendered by the reading session): whatever the server's
# or the role's defaults, a value reads the same, in the form from_json types back.
TEXT_SETTINGS = {
    "TimeZone": "UTC",
    "DateStyle": "ISO,YMD",
    "IntervalStyle": "postgres",
    "extra_float_digits": "1",  # shortest text that reads back to the same float
    "bytea_output": "hex",
    "lc_monetary": "C",
}
_OPTIONS = " ".join(f"-c {k}={v}" for k, v in TEXT_SETTINGS.items())  # libpq `options`


def _connect(dsn: str, **kwargs):
    import psycopg  # imported where used: executors need it, the driver's planner does not
    from psycopg.conninfo import conninfo_to_dict

    theirs = conninfo_to_dict(dsn).get("options")
    options = f"{theirs} {_OPTIONS}" if theirs else _OPTIONS  # ours last: they win
    return psycopg.connect(dsn, options=options, **kwargs)


def _qualified(name: str) -> str:
    name = name.strip()
    return name if "." in name else f"public.{name}"


def _quoted(table: str) -> str:
    schema, name = table.split(".", 1)
    return f'"{schema}"."{name}"'


@dataclass(frozen=True)
class Config:
    """The source's options, checked; what every partition carries to its executor."""

    dsn: str
    slot: str
    publication: str
    tables: tuple[str, ...]
    keys: tuple[tuple[str, tuple[str, ...]], ...]  # resolved against the catalog

    @classmethod
    def parse(cls, options: dict[str, str]) -> Config:
        dsn = options.get("dsn")
        if not dsn:
            raise SourceOptionError(
                option="dsn",
                source=NAME,
                problem="is missing",
                fix="Give a libpq connection string, e.g. 'host=db port=5432 dbname=shop "
                "user=cdc'.",
            )
        tables = tuple(_qualified(t) for t in options.get("tables", "").split(",") if t.strip())
        if not tables:
            raise SourceOptionError(
                option="tables",
                source=NAME,
                problem="is missing",
                fix="Name the tables to capture, e.g. 'public.orders,public.customers'.",
            )
        slot = options.get("slot", "autocdc")
        given = {
            _qualified(k.split(".", 1)[1]): tuple(c.strip() for c in v.split(","))
            for k, v in options.items()
            if k.lower().startswith("keys.")
        }
        config = cls(dsn, slot, options.get("publication", slot), tables, ())
        return config.with_keys(given)

    def with_keys(self, given: dict[str, tuple[str, ...]]) -> Config:
        """Each table's key: the option's, else its primary key; refuse what cannot work."""
        keys = []
        with _connect(self.dsn, autocommit=True) as conn:
            level = conn.execute("SHOW wal_level").fetchone()[0]
            if level != "logical":
                raise WalLevelError(level=level)
            for table in self.tables:
                keys.append((table, self._key(conn, table, given.get(table))))
        return Config(self.dsn, self.slot, self.publication, self.tables, tuple(keys))

    @staticmethod
    def _key(conn, table: str, given: tuple[str, ...] | None) -> tuple[str, ...]:
        found = conn.execute(
            "SELECT c.oid, c.relreplident FROM pg_class c JOIN pg_namespace n "
            "ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relname = %s",
            table.split(".", 1),
        ).fetchone()
        if found is None:
            raise TableNotFoundError(table=table)
        oid, identity = found
        columns = [
            r[0]
            for r in conn.execute(
                "SELECT attname FROM pg_attribute WHERE attrelid = %s AND attnum > 0 "
                "AND NOT attisdropped ORDER BY attnum",
                (oid,),
            )
        ]
        primary = [
            r[0]
            for r in conn.execute(
                "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid "
                "AND a.attnum = ANY(i.indkey) WHERE i.indrelid = %s AND i.indisprimary "
                "ORDER BY array_position(i.indkey::int2[], a.attnum)",
                (oid,),
            )
        ]
        if given is None:
            if not primary:
                raise NoPrimaryKeyError(table=table)
            return tuple(primary)
        unknown = [c for c in given if c not in columns]
        if unknown:
            raise UnknownKeyColumnError(table=table, columns=unknown, available=columns)
        if not primary and identity != "f":
            raise ReplicaIdentityError(table=table, identity=identity, keys=list(given))
        return given


@dataclass(frozen=True)
class SnapshotPartition(InputPartition):
    config: Config
    table: str
    snapshot: str
    lsn: str


@dataclass(frozen=True)
class StreamPartition(InputPartition):
    config: Config
    start: str
    end: str


class PostgresSource(DataSource):
    """``format("postgres_cdc")``: change rows of :data:`pgchanges.CHANGES_SCHEMA`."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        return pgchanges.CHANGES_SCHEMA

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return PostgresStreamReader(Config.parse(dict(self.options)))


class PostgresStreamReader(DataSourceStreamReader):
    def __init__(self, config: Config) -> None:
        self.config = config
        self._exporter = None  # the replication connection holding the initial snapshot
        self._initial: dict | None = None

    def initialOffset(self) -> dict:
        return dict(START)

    def latestOffset(self, start: dict, limit: object = None) -> dict:
        if start == START:
            if self._initial is None:
                self._initial = self._create_slot()
            return self._initial
        with _connect(self.config.dsn, autocommit=True) as conn:
            flush = conn.execute("SELECT pg_current_wal_flush_lsn()::text").fetchone()[0]
        if pg.parse_lsn(flush) <= pg.parse_lsn(start["lsn"]):
            return start
        return {"lsn": flush}

    def _create_slot(self) -> dict:
        """A new slot and the snapshot its changes start after. A slot left by an earlier
        start of this query (no batch committed) has no snapshot to go with: recreated."""
        cfg = self.config
        with _connect(cfg.dsn, autocommit=True) as conn:
            conn.execute(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                "WHERE slot_name = %s",
                (cfg.slot,),
            )
            published = {
                f"{s}.{t}"
                for s, t in conn.execute(
                    "SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = %s",
                    (cfg.publication,),
                )
            }
            exists = conn.execute(
                "SELECT 1 FROM pg_publication WHERE pubname = %s", (cfg.publication,)
            ).fetchone()
            missing = ", ".join(_quoted(t) for t in cfg.tables if t not in published)
            if not exists:
                conn.execute(f'CREATE PUBLICATION "{cfg.publication}" FOR TABLE {missing}')
            elif missing:
                conn.execute(f'ALTER PUBLICATION "{cfg.publication}" ADD TABLE {missing}')
        self._exporter = _connect(cfg.dsn, autocommit=True, replication="database")
        result = self._exporter.pgconn.exec_(
            f'CREATE_REPLICATION_SLOT "{cfg.slot}" LOGICAL pgoutput EXPORT_SNAPSHOT'.encode()
        )
        if result.error_message:
            raise RuntimeError(result.error_message.decode())
        lsn, snapshot = result.get_value(0, 1).decode(), result.get_value(0, 2).decode()
        return {"lsn": lsn, "snapshot": snapshot}

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        if start == START:
            return [
                SnapshotPartition(self.config, table, end["snapshot"], end["lsn"])
                for table in self.config.tables
            ]
        return [StreamPartition(self.config, start["lsn"], end["lsn"])]

    def read(self, partition: InputPartition) -> Iterator[tuple]:
        if isinstance(partition, SnapshotPartition):
            return _read_snapshot(partition)
        assert isinstance(partition, StreamPartition)
        return _read_stream(partition)

    def commit(self, end: dict) -> None:
        """Acknowledge: the slot may free the WAL before ``end``. Retried while a reader
        of an earlier attempt still holds the slot."""
        for attempt in range(_COMMIT_ATTEMPTS):
            try:
                with _connect(self.config.dsn, autocommit=True) as conn:
                    conn.execute(
                        "SELECT pg_replication_slot_advance(slot_name, %s::pg_lsn) "
                        "FROM pg_replication_slots WHERE slot_name = %s "
                        "AND confirmed_flush_lsn < %s::pg_lsn",
                        (end["lsn"], self.config.slot, end["lsn"]),
                    )
                break
            except Exception:
                if attempt == _COMMIT_ATTEMPTS - 1:
                    raise
                time.sleep(0.5 * (attempt + 1))
        if "snapshot" in end:
            self._close_exporter()

    def stop(self) -> None:
        self._close_exporter()

    def _close_exporter(self) -> None:
        if self._exporter is not None:
            self._exporter.close()
            self._exporter = None


def _read_snapshot(part: SnapshotPartition) -> Iterator[tuple]:
    import psycopg

    with _connect(part.config.dsn) as conn:
        # The transaction psycopg begins: importing a snapshot must be its first statement.
        conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        conn.read_only = True
        try:
            conn.execute(f"SET TRANSACTION SNAPSHOT '{part.snapshot}'")
        except psycopg.Error as error:
            raise SnapshotLostError(slot=part.config.slot, snapshot=part.snapshot) from error
        columns = conn.execute(
            "SELECT attname, atttypid FROM pg_attribute WHERE attrelid = %s::regclass "
            "AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
            (_quoted(part.table),),
        ).fetchall()
        names = [c[0] for c in columns]
        oids = [c[1] for c in columns]
        texts = ", ".join(f'"{n}"::text' for n in names)
        with conn.cursor(name="autocdc_snapshot") as cursor:
            cursor.execute(f"SELECT {texts} FROM {_quoted(part.table)}")
            for values in cursor:
                yield pgchanges.snapshot_row(part.table, part.lsn, names, values, oids)


def _read_stream(part: StreamPartition) -> Iterator[tuple]:
    cfg = part.config
    decoder = pgchanges.ChangeDecoder(
        dict(cfg.keys), pg.parse_lsn(part.start), pg.parse_lsn(part.end)
    )
    with _connect(cfg.dsn) as conn, conn.cursor(name="autocdc_peek") as cursor:
        cursor.execute(_PEEK, (cfg.slot, part.end, cfg.publication))
        for lsn, data in cursor:
            yield from decoder.feed(lsn, data)


def postgres_table(changes: DataFrame, table: str, schema: str | StructType) -> DataFrame:
    """One table's change rows, typed by ``schema`` (DDL like ``"id INT, name STRING"``).

    The result has the schema's columns, ``_CHANGE_TYPE``, ``_CHANGE_SEQUENCE_NUMBER`` and
    ``_corrupt_record``: a value that does not fit its declared type, or a change that
    could not be read, sets it, and the flow quarantines the row with its raw text.
    """
    parsed_schema = _parse_datatype_string(schema) if isinstance(schema, str) else schema
    corrupt = changes.sparkSession.conf.get(
        "spark.sql.columnNameOfCorruptRecord", "_corrupt_record"
    )
    with_corrupt = StructType([*parsed_schema.fields]).add(corrupt, "string")
    parsed: Column = F.from_json(
        "data", with_corrupt, {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": corrupt}
    )
    mine = changes.where((F.col("table") == _qualified(table)) | F.col("table").isNull())
    return mine.select(
        *[parsed[f.name].alias(f.name) for f in parsed_schema.fields],
        "_CHANGE_TYPE",
        "_CHANGE_SEQUENCE_NUMBER",
        F.coalesce(F.col("_corrupt_record"), parsed[corrupt]).alias(corrupt),
    )
