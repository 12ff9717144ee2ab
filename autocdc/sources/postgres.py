"""PostgreSQL log-based capture: a Spark streaming source over a logical replication slot.

``spark.readStream.format("postgres_cdc")`` with options ``dsn`` (libpq connection string),
``tables`` (comma-separated, ``schema.table`` or ``table`` for ``public``), ``slot``
(default ``autocdc``), ``publication`` (default: the slot's name; created for the tables
when missing), ``keys.<schema.table>`` for a table without a primary key and
``load_batch_rows`` (rows of the initial load per micro-batch, default 100000).

Offsets are LSNs, and while the initial load runs, how far it got (a table and the last
key loaded). The first batch creates the slot (or reuses the one a killed start left);
from then on every batch peeks the changes of the transactions that committed in
``[start, end)`` without consuming them, and :meth:`commit`, called by Spark only after the
batch is written, advances the slot. A crash therefore replays a batch, never loses one.

The initial load is chunked and interleaved with the log: each batch also reads the next
key range of a table. While the process that created the slot lives, every range is read
inside the snapshot the slot exported (its replication connection is kept open and idle
for that): each row is an upsert at the slot's consistent point (``<point>/0``), before
every change the slot decodes, so an SCD type 2 history begins with every row as it was
when capture began. A restarted process has no such snapshot: the ranges still to load
fall back to watermarks (as Netflix's DBLog and Debezium's incremental snapshots): read
the range, write a watermark to the log (a flushed logical message), peek up to it; a key
the log touched in between is dropped from the read (the log carries its value) but keeps,
where the log sent it (``REPLICA IDENTITY FULL``), the row it held before, and the other
rows are upserts at the watermark. Either way a restart only re-reads a range: nothing is
lost or applied twice, no full refresh; the offsets name the tables that fell back
(``watermarked``), which the event log and ``autocdc status`` show. One streaming query
reads one slot: to feed several targets, append the changes to a table and have each flow
read its own table's rows from it (:func:`postgres_table`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow
from pyspark.sql.types import StructType, _parse_datatype_string

from autocdc.sources import pgchanges
from autocdc.sources import pgoutput as pg
from autocdc.sources.errors import (
    NoPrimaryKeyError,
    ReplicaIdentityError,
    SourceOptionError,
    TableNotFoundError,
    UnknownKeyColumnError,
    WalLevelError,
)

log = logging.getLogger("autocdc")
NAME = "postgres_cdc"
START = {"lsn": "0/0"}  # before the initial load
_PEEK = (
    "SELECT lsn::text, data FROM pg_logical_slot_peek_binary_changes("
    "%s, %s::pg_lsn, NULL, 'proto_version', '1', 'publication_names', %s)"
)
_COMMIT_ATTEMPTS = 10
# Why a table's initial load went by watermarks (the offsets' `watermarked`).
RESTARTED = (
    "the process that created the slot stopped before the table was loaded: the snapshot "
    "it exported is gone"
)
ADDED = "the table was added to the capture after the slot was created"
REFUSED = (
    "the server refused a replication connection (max_wal_senders = 0, or a connection "
    "pooler in between), so the slot exported no snapshot"
)
LOAD_BATCH_ROWS = 100_000  # held in memory by the batch's reader until its watermark
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


def connect(dsn: str, **kwargs):
    """A connection with :data:`TEXT_SETTINGS` over the server's, the database's and the
    role's defaults (and over any the DSN's ``options`` give)."""
    import psycopg  # imported where used: executors need it, the driver's planner does not
    from psycopg.conninfo import conninfo_to_dict

    theirs = conninfo_to_dict(dsn).get("options")
    options = f"{theirs} {_OPTIONS}" if theirs else _OPTIONS  # ours last: they win
    return psycopg.connect(dsn, options=options, **kwargs)


def qualified(name: str) -> str:
    name = name.strip()
    return name if "." in name else f"public.{name}"


def quoted(table: str) -> str:
    schema, name = table.split(".", 1)
    return f'"{schema}"."{name}"'


def table_columns(conn, table: str) -> list[tuple[str, int, int]]:
    """A ``schema.table``'s columns in order: name, type oid and type modifier; empty when
    there is no such table."""
    return conn.execute(
        "SELECT a.attname, a.atttypid, a.atttypmod FROM pg_attribute a "
        "JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = %s AND c.relname = %s AND a.attnum > 0 AND NOT a.attisdropped "
        "ORDER BY a.attnum",
        table.split(".", 1),
    ).fetchall()


@dataclass(frozen=True)
class Config:
    """The source's options, checked; what every partition carries to its executor."""

    dsn: str
    slot: str
    publication: str
    tables: tuple[str, ...]
    keys: tuple[tuple[str, tuple[str, ...]], ...]  # resolved against the catalog
    load_batch_rows: int = LOAD_BATCH_ROWS

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
        tables = tuple(qualified(t) for t in options.get("tables", "").split(",") if t.strip())
        if not tables:
            raise SourceOptionError(
                option="tables",
                source=NAME,
                problem="is missing",
                fix="Name the tables to capture, e.g. 'public.orders,public.customers'.",
            )
        slot = options.get("slot", "autocdc")
        given = {
            qualified(k.split(".", 1)[1]): tuple(c.strip() for c in v.split(","))
            for k, v in options.items()
            if k.lower().startswith("keys.")
        }
        rows = options.get("load_batch_rows", str(LOAD_BATCH_ROWS))
        if not rows.isdigit() or int(rows) < 1:
            raise SourceOptionError(
                option="load_batch_rows",
                source=NAME,
                problem=f"is {rows!r}",
                fix="Give the number of rows the initial load reads per micro-batch, e.g. "
                f"'{LOAD_BATCH_ROWS}'.",
            )
        config = cls(dsn, slot, options.get("publication", slot), tables, (), int(rows))
        return config.with_keys(given)

    def with_keys(self, given: dict[str, tuple[str, ...]]) -> Config:
        """Each table's key: the option's, else its primary key; refuse what cannot work."""
        keys = []
        with connect(self.dsn, autocommit=True) as conn:
            level = conn.execute("SHOW wal_level").fetchone()[0]
            if level != "logical":
                raise WalLevelError(level=level)
            for table in self.tables:
                keys.append((table, self._key(conn, table, given.get(table))))
        return replace(self, keys=tuple(keys))

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


Range = tuple[str, tuple[str, ...] | None, tuple[str, ...] | None]  # table, after, up to


@dataclass(frozen=True)
class Exported:
    """The snapshot the slot exported when it was created: the tables as of its consistent
    point ``lsn``, importable while the creating connection stays open and idle."""

    name: str
    lsn: str


@dataclass(frozen=True)
class StreamPartition(InputPartition):
    config: Config
    start: str
    end: str
    load: tuple[Range, ...] = ()  # key ranges of the initial load read with this batch
    exported: Exported | None = None  # read the ranges in it; None: by watermarks
    pending: tuple[str, ...] = ()  # tables not loaded whole before this batch


class PostgresSource(DataSource):
    """``format("postgres_cdc")``: change rows of :data:`pgchanges.CHANGES_SCHEMA`."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        return pgchanges.CHANGES_SCHEMA

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return PostgresStreamReader(Config.parse(dict(self.options)))


class PostgresStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, config: Config) -> None:
        self.config = config
        self._target: int | None = None  # availableNow: read no change after this LSN
        self._opened = False  # publication (and, at the start, the slot) checked
        self._exporter = None  # the replication connection holding the exported snapshot
        self._exported: Exported | None = None
        # Tables whose ranges this process read by watermarks, and why: the next offset
        # adds them to its `watermarked`.
        self._fell_back: dict[str, str] = {}
        self._refused = False  # the server refused the replication connection

    def initialOffset(self) -> dict:
        return dict(START)

    def prepareForTriggerAvailableNow(self) -> None:
        with connect(self.config.dsn, autocommit=True) as conn:
            self._target = pg.parse_lsn(_flush_lsn(conn))

    def latestOffset(self, start: dict, limit: object = None) -> dict:
        with connect(self.config.dsn, autocommit=True) as conn:
            if not self._opened:
                self._open_slot(conn, create=start == START)
                self._opened = True
            flush = pg.parse_lsn(_flush_lsn(conn))
            if self._target is not None:
                flush = min(flush, self._target)
            lsn = {"lsn": pg.format_lsn(max(flush, pg.parse_lsn(start["lsn"])))}
            order = _order(self.config, start)
            watermarked = {**start.get("watermarked", {}), **self._fell_back}
            notes = {"watermarked": watermarked} if watermarked else {}
            position = _load_position(self.config, start)
            if position is None:
                self.stop()  # every range is read (and written): the snapshot may go
                done = {**lsn, "tables": order, **notes}
                return start if done == start else done
            exported = {"exported": asdict(self._exported)} if self._exported else {}
            plan = self._plan_load(conn, order, *position)
            return {**lsn, "tables": order, **notes, **exported, **plan}

    def _plan_load(self, conn, order: list[str], table: str, after) -> dict:
        """Where the next batch's load ends: ``load_batch_rows`` rows on, across the ends of
        tables; no ``load`` when the rest of the last table fits."""
        budget = self.config.load_batch_rows
        while True:
            upto, left = _nth_key(conn, self.config, table, after, budget)
            if upto is not None:
                return {"load": {"table": table, "after": list(upto)}}
            following = order.index(table) + 1
            if following == len(order):
                return {}
            table, after, budget = order[following], None, max(budget - left, 1)

    def _open_slot(self, conn, create: bool) -> None:
        """The publication, with a table added to ``tables`` since; when the query plans its
        first batch (``create``), the slot, made anew: a slot found then (left by a start
        killed before it planned a batch, or by the checkpoint a full refresh dropped) has
        given this query nothing, every change it holds is in the tables the load reads,
        and only a new slot exports the snapshot that load reads in."""
        cfg = self.config
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
        missing = ", ".join(quoted(t) for t in cfg.tables if t not in published)
        if not exists:
            conn.execute(f'CREATE PUBLICATION "{cfg.publication}" FOR TABLE {missing}')
        elif missing:
            conn.execute(f'ALTER PUBLICATION "{cfg.publication}" ADD TABLE {missing}')
        if not create:
            return
        _retried(
            lambda: conn.execute(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                "WHERE slot_name = %s",
                (cfg.slot,),
            )
        )
        self._create_slot(conn)

    def _create_slot(self, conn) -> None:
        """Create the slot over a replication connection, which exports the snapshot of its
        consistent point; the connection is kept, idle, while the load reads in it. Where
        the server refuses a replication connection (``max_wal_senders = 0``, a pooler),
        the slot is created over ``conn`` and the load goes by watermarks."""
        import psycopg

        cfg = self.config
        try:
            exporter = connect(cfg.dsn, autocommit=True, replication="database")
        except psycopg.OperationalError as refused:
            log.warning("%s: %s", REFUSED, refused)
            conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (cfg.slot,))
            self._refused = True
            return
        created = exporter.execute(
            f"CREATE_REPLICATION_SLOT \"{cfg.slot}\" LOGICAL pgoutput (SNAPSHOT 'export')"
        ).fetchone()
        self._exporter, self._exported = exporter, Exported(name=created[2], lsn=created[1])

    def stop(self) -> None:
        """Let the exported snapshot go (the server may then vacuum what it held back)."""
        if self._exporter is not None:
            self._exporter.close()
        self._exporter = self._exported = None

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        """One partition: a slot has one reader. It carries the key ranges of the load from
        ``start``'s position to ``end``'s (the tables between them whole), and the exported
        snapshot to read them in when this process holds the one ``end`` was planned with
        (a batch replayed after a restart falls back to watermarks)."""
        first, last = _load_position(self.config, start), _load_position(self.config, end)
        tables, ranges, pending = _order(self.config, end), [], ()
        if first is not None and first[0] in tables:
            pending = tuple(tables[tables.index(first[0]) :])
            # A position with no key begins its table: the ranges before it end there.
            stop = len(tables) if last is None else tables.index(last[0]) + (last[1] is not None)
            for table in tables[tables.index(first[0]) : stop]:
                after = first[1] if table == first[0] else None
                upto = last[1] if last is not None and table == last[0] else None
                ranges.append((table, after, upto))
        held = self._exported
        if held is not None and end.get("exported") != asdict(held):
            held = None
        if held is None:
            known = start.get("tables", list(self.config.tables))
            for table, _, _ in ranges:
                why = REFUSED if self._refused else RESTARTED if table in known else ADDED
                if table not in self._fell_back:
                    self._fell_back[table] = why
                    log.warning("the initial load of %s goes by watermarks: %s", table, why)
        part = StreamPartition(self.config, start["lsn"], end["lsn"], tuple(ranges), held, pending)
        return [part]

    def read(self, partition: InputPartition) -> Iterator:
        assert isinstance(partition, StreamPartition)
        return pgchanges.arrow_batches(_read(partition))

    def commit(self, end: dict) -> None:
        """Acknowledge: the slot may free the WAL before ``end``. Retried while a reader
        of an earlier attempt still holds the slot."""

        def advance() -> None:
            with connect(self.config.dsn, autocommit=True) as conn:
                conn.execute(
                    "SELECT pg_replication_slot_advance(slot_name, %s::pg_lsn) "
                    "FROM pg_replication_slots WHERE slot_name = %s "
                    "AND confirmed_flush_lsn < %s::pg_lsn",
                    (end["lsn"], self.config.slot, end["lsn"]),
                )

        _retried(advance, Exception)


def _retried(statement: Callable[[], object], errors: type[Exception] | None = None) -> None:
    """Run ``statement``, again while it fails with ``errors`` (by default: the slot is
    still held by the server process of a reader that was killed; it lets go when it
    notices)."""
    import psycopg

    retried = errors or psycopg.errors.ObjectInUse
    for attempt in range(_COMMIT_ATTEMPTS):
        try:
            statement()
            return
        except retried:
            if attempt == _COMMIT_ATTEMPTS - 1:
                raise
            time.sleep(0.5 * (attempt + 1))


def _flush_lsn(conn) -> str:
    return conn.execute("SELECT pg_current_wal_flush_lsn()::text").fetchone()[0]


def _order(config: Config, offset: dict) -> list[str]:
    """The tables in the order the load takes them: those an offset planned (its
    ``tables``), then those added to the option since; none that it no longer names."""
    known = [] if offset == START else offset.get("tables", list(config.tables))
    added = [t for t in config.tables if t not in known]
    return [t for t in known if t in config.tables] + added


def _load_position(config: Config, offset: dict) -> tuple[str, tuple[str, ...] | None] | None:
    """Where the initial load goes on from: a table and the last key loaded, or None when
    every table is loaded. A table added to the option since is loaded next; one it no
    longer names is not. (An offset of the format before, with an exported ``snapshot``,
    has no ``load``: a batch that ends at one and is replayed loads every table.)"""
    order = _order(config, offset)
    if offset == START:
        return order[0], None
    load = offset.get("load")
    if load is not None and load["table"] in order:
        return load["table"], tuple(load["after"]) if load["after"] is not None else None
    known = offset.get("tables", list(config.tables))
    if load is not None:  # its table was taken out of the option: on with the next
        following = [t for t in known[known.index(load["table"]) + 1 :] if t in order]
        if following:
            return following[0], None
    added = [t for t in order if t not in known]
    return (added[0], None) if added else None


def _key_columns(conn, config: Config, table: str) -> list[tuple[str, str]]:
    """The table's key columns and their SQL types, to compare keys as the index does."""
    keys = dict(config.keys)[table]
    types = dict(
        conn.execute(
            "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute "
            "WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped",
            (quoted(table),),
        ).fetchall()
    )
    return [(k, types[k]) for k in keys]


def _after(columns: list[tuple[str, str]], key: tuple[str, ...], op: str) -> tuple[str, list]:
    names = ", ".join(f'"{k}"' for k, _ in columns)
    values = ", ".join(f"%s::{t}" for _, t in columns)
    return f"({names}) {op} ({values})", list(key)


def _nth_key(
    conn, config: Config, table: str, after: tuple[str, ...] | None, n: int
) -> tuple[tuple[str, ...] | None, int]:
    """The ``n``-th key after ``after`` in key order (where the next range ends), or None
    and how many rows are left when there are fewer: the range is the rest of the table."""
    columns = _key_columns(conn, config, table)
    where, params = _after(columns, after, ">") if after is not None else ("true", [])
    # A NULL key (a `keys.` option's column) is never a bound: its rows end the table.
    where += "".join(f' AND "{k}" IS NOT NULL' for k, _ in columns)
    order = ", ".join(f'"{k}"' for k, _ in columns)
    # Aliased: ORDER BY "id" would sort by the output column, the text.
    texts = ", ".join(f'"{k}"::text AS _key{i}' for i, (k, _) in enumerate(columns))
    rest = f"SELECT {texts} FROM {quoted(table)} WHERE {where} ORDER BY {order}"
    found = conn.execute(f"{rest} OFFSET {n - 1} LIMIT 1", params).fetchone()
    if found is not None:
        return tuple(found), n
    left = conn.execute(f"SELECT count(*) FROM ({rest}) AS rest", params).fetchone()[0]
    return None, left


def _read(part: StreamPartition) -> Iterator[tuple]:
    """The log's changes in ``[start, end)``, then the rows of the load's ranges: in the
    exported snapshot, at its point; else by a watermark written after reading them, less
    the keys the log touched up to it (it carries their values).

    Both ways also give, of each key of a table still loading that the log touched, the
    row it held where the slot stood, when the log sent it (``REPLICA IDENTITY FULL``): a
    row the watermark method drops, or one a later range read by watermarks would miss,
    keeps its capture-time state that way."""
    import psycopg

    cfg, exported = part.config, part.exported
    if exported is not None:
        try:
            loaded = [_read_range(cfg, *r, snapshot=exported.name) for r in part.load]
        except psycopg.errors.InvalidParameterValue:  # its connection closed under us
            log.warning("the exported snapshot %s is gone: this batch uses watermarks", exported)
            exported = None
    if exported is None:
        loaded = [_read_range(cfg, *r) for r in part.load]
    with connect(cfg.dsn) as conn:
        upto = stood = part.end
        if part.load:
            with conn.transaction():  # flushed at commit, with every change before it
                conn.execute("SET LOCAL synchronous_commit = on")
                stood = conn.execute(
                    "SELECT confirmed_flush_lsn::text FROM pg_replication_slots "
                    "WHERE slot_name = %s",
                    (cfg.slot,),
                ).fetchone()[0]
                if exported is None:
                    upto = conn.execute(
                        "SELECT pg_logical_emit_message(true, 'autocdc', 'load')::text"
                    ).fetchone()[0]
        decoder = pgchanges.ChangeDecoder(
            dict(cfg.keys), pg.parse_lsn(part.start), pg.parse_lsn(part.end), set(part.pending)
        )
        high = max(pg.parse_lsn(upto), pg.parse_lsn(part.end))
        for lsn, data in _peek(conn, cfg, pg.format_lsn(high)):
            yield from decoder.feed(lsn, data)
    # No change to a touched key came between where the slot stood and its first change.
    for table, before in decoder.touched.items():
        for payload in before.values():
            if payload is not None:
                yield pgchanges.load_row(table, f"{stood}/0", stood, payload)
    if exported is not None:
        at, upto = f"{exported.lsn}/0", exported.lsn  # before every change the slot decodes
    else:
        at = f"{pg.format_lsn(high)}/0"  # after every change the read saw
    for (table, _, _), (names, oids, rows) in zip(part.load, loaded, strict=True):
        if exported is None and table in decoder.truncated:
            continue  # every row it read is gone or came back through the log
        keys = dict(cfg.keys)[table]
        for values in rows:
            row = pgchanges.snapshot_row(table, at, upto, names, values, oids)
            if exported is not None or pgchanges.key_of(row, keys) not in decoder.touched[table]:
                yield row


def _peek(conn, cfg: Config, upto: str) -> Iterator[tuple[str, bytes]]:
    """The slot's changes up to ``upto``, streamed. Retried while the slot is still held by
    the server process of a reader that was killed (it lets go when it notices)."""
    import psycopg

    for attempt in range(_COMMIT_ATTEMPTS):
        cursor = conn.cursor(name="autocdc_peek")
        try:
            cursor.execute(_PEEK, (cfg.slot, upto, cfg.publication))
            first = cursor.fetchmany(1000)  # the slot is taken here, or refused
        except psycopg.errors.ObjectInUse:
            cursor.close()
            conn.rollback()
            if attempt == _COMMIT_ATTEMPTS - 1:
                raise
            time.sleep(0.5 * (attempt + 1))
            continue
        with cursor:
            yield from first
            yield from cursor
        return


def _read_range(
    config: Config, table: str, after, upto, snapshot: str | None = None
) -> tuple[list, list, list]:
    """One key range of a table, as text (``TEXT_SETTINGS``), in one statement's snapshot,
    or in the exported ``snapshot``. The range that ends a table also takes rows with a
    NULL key (quarantined by the flow)."""
    import psycopg
    from psycopg import sql

    with connect(config.dsn) as conn:
        conn.read_only = True
        if snapshot is not None:
            conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            conn.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(snapshot)))
        columns = table_columns(conn, table)
        key = _key_columns(conn, config, table)
        where, params = ["true"], []
        if after is not None:
            clause, values = _after(key, after, ">")
            where.append(clause)
            params += values
        if upto is not None:
            clause, values = _after(key, upto, "<=")
            where.append(clause)
            params += values
        predicate = " AND ".join(where)
        if upto is None:
            nulls = " OR ".join(f'"{k}" IS NULL' for k, _ in key)
            predicate = f"({predicate}) OR {nulls}"
        texts = ", ".join(_as_text(name, oid) for name, oid, _ in columns)
        with conn.cursor(name="autocdc_load") as cursor:
            cursor.execute(f"SELECT {texts} FROM {quoted(table)} WHERE {predicate}", params)
            rows = cursor.fetchall()
    return [c[0] for c in columns], [c[1] for c in columns], rows


_BPCHAR = 1042  # character(n)


def _as_text(name: str, type_oid: int) -> str:
    """A column as the log sends it: its type's output text. A cast to text is that for
    every type but ``character(n)``, whose cast drops the padding its output keeps (a
    row loaded from the table and the same row from the log would differ); ``format``
    renders it with its output function."""
    if type_oid == _BPCHAR:
        # %% for psycopg, which takes the statement's parameters with it.
        return f'CASE WHEN "{name}" IS NULL THEN NULL ELSE format(\'%%s\', "{name}") END'
    return f'"{name}"::text'


def postgres_table(changes: DataFrame, table: str, schema: str | StructType) -> DataFrame:
    """One table's change rows, typed by ``schema`` (DDL like ``"id INT, name STRING"``).

    The result has the schema's columns, ``_CHANGE_TYPE``, ``_CHANGE_SEQUENCE_NUMBER`` and
    ``_corrupt_record``: a value that does not fit its declared type, or a change that
    could not be read, sets it, and the flow quarantines the row with its raw text.
    """
    mine = changes.where((F.col("table") == qualified(table)) | F.col("table").isNull())
    values, corrupt = typed_columns(mine, schema)
    return mine.select(*values, "_CHANGE_TYPE", "_CHANGE_SEQUENCE_NUMBER", corrupt)


def typed_columns(rows: DataFrame, schema: str | StructType) -> tuple[list[Column], Column]:
    """The columns of ``schema`` parsed from ``rows``' ``data`` (a JSON object per row, of
    :func:`pgchanges.json_value` tokens), and the corrupt-record column: ``rows``' own
    ``_corrupt_record`` (a row that could not be read), else the text of a row with a value
    that does not fit its declared type."""
    parsed_schema = _parse_datatype_string(schema) if isinstance(schema, str) else schema
    corrupt = rows.sparkSession.conf.get("spark.sql.columnNameOfCorruptRecord", "_corrupt_record")
    with_corrupt = StructType([*parsed_schema.fields]).add(corrupt, "string")
    parsed: Column = F.from_json(
        "data", with_corrupt, {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": corrupt}
    )
    values = [parsed[f.name].alias(f.name) for f in parsed_schema.fields]
    return values, F.coalesce(F.col("_corrupt_record"), parsed[corrupt]).alias(corrupt)
