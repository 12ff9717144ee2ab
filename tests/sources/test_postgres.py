"""PostgreSQL log-based capture against a real server (tests/support/pgserver.py).

The stream reader is driven here the way Spark drives it (latestOffset, partitions, read,
commit), so a test can write to the database at the exact moments that matter: between
the slot's creation and the initial load, between the load's batches, and between a batch
and its commit. The change
rows are then applied with AutoCdcFlow and the target compared with the source table.
"""

from __future__ import annotations

import json
import math
import secrets
from decimal import Decimal

import extracting
import pytest
from chispa import assert_df_equality
from pgserver import Server
from pyspark.sql import functions as F

import autocdc
from autocdc.engine.errors import QUARANTINE_MALFORMED_RECORD
from autocdc.sources.errors import (
    NoPrimaryKeyError,
    ReplicaIdentityError,
    SourceOptionError,
    UnknownKeyColumnError,
)
from autocdc.sources.extract import Extraction, ExtractionOptions
from autocdc.sources.pgchanges import CHANGES_SCHEMA
from autocdc.sources.postgres import (
    REFUSED,
    RESTARTED,
    Config,
    PostgresStreamReader,
    postgres_table,
)

ITEMS = "id BIGINT, sku STRING, quantity INT, price DECIMAL(10,2)"


@pytest.fixture(scope="module")
def pg():
    server = Server().start()
    yield server
    server.stop()


def _tables(pg: Server, suffix: str) -> tuple[str, str]:
    items, logs = f"items_{suffix}", f"logs_{suffix}"
    pg.execute(
        f"CREATE TABLE {items} (id bigint PRIMARY KEY, sku text, quantity int, "
        f"price numeric(10,2)); CREATE TABLE {logs} (id int, line text)"
    )
    return items, logs


def _reader(pg: Server, slot: str, tables: str, **options: str) -> PostgresStreamReader:
    return PostgresStreamReader(
        Config.parse({"dsn": pg.dsn, "slot": slot, "tables": tables, **options})
    )


def _rows(reader: PostgresStreamReader, start: dict, end: dict) -> list[tuple]:
    """The change rows the reader gives Spark for ``[start, end)`` (record batches), as
    tuples of :data:`CHANGES_SCHEMA`."""
    batches = [b for part in reader.partitions(start, end) for b in reader.read(part)]
    return [row for b in batches for row in zip(*b.to_pydict().values(), strict=True)]


def _batch(reader: PostgresStreamReader, start: dict) -> tuple[list[tuple], dict]:
    """One micro-batch as Spark runs it, without the commit."""
    end = reader.latestOffset(start, None)
    rows = _rows(reader, start, end)
    return rows, end


def _apply(spark, flow: autocdc.AutoCdcFlow, rows: list[tuple], table: str, schema: str):
    changes = spark.createDataFrame(rows, CHANGES_SCHEMA)
    return flow.apply(postgres_table(changes, table, schema))


def _assert_mirrors(spark, pg: Server, target: str, table: str) -> None:
    """The Delta target holds exactly the rows of the PostgreSQL table."""
    columns = [f.split()[0] for f in ITEMS.split(", ")]
    rows = pg.query(f"SELECT {', '.join(columns)} FROM {table}")
    assert_df_equality(
        spark.table(target),
        spark.createDataFrame(rows, ITEMS),
        ignore_row_order=True,
        ignore_nullable=True,
    )


def test_options_and_tables_that_cannot_work_are_refused(pg):
    items, logs = _tables(pg, "refused")
    with pytest.raises(SourceOptionError):
        Config.parse({"tables": items})
    with pytest.raises(NoPrimaryKeyError) as refused:
        Config.parse({"dsn": pg.dsn, "tables": f"{items},{logs}"})
    assert refused.value.params["table"] == f"public.{logs}"
    with pytest.raises(UnknownKeyColumnError):
        Config.parse({"dsn": pg.dsn, "tables": logs, f"keys.{logs}": "nope"})
    with pytest.raises(ReplicaIdentityError):  # deletes would not carry `id`
        Config.parse({"dsn": pg.dsn, "tables": logs, f"keys.{logs}": "id"})
    pg.execute(f"ALTER TABLE {logs} REPLICA IDENTITY FULL")
    config = Config.parse({"dsn": pg.dsn, "tables": f"{items},{logs}", f"keys.{logs}": "id"})
    assert dict(config.keys) == {f"public.{items}": ("id",), f"public.{logs}": ("id",)}


def test_initial_load_and_stream_lose_nothing_and_apply_nothing_twice(spark, pg, new_table):
    items, _ = _tables(pg, "load")
    pg.execute(
        f"INSERT INTO {items} SELECT g, 'sku-' || g, g, g * 1.25 FROM generate_series(1, 6) g"
    )
    reader = _reader(pg, "load", items)
    start = reader.initialOffset()
    end = reader.latestOffset(start, None)  # the slot exists from here
    # Written after the slot, before the load reads the table: the load reads the table
    # as it was when the slot was created (the snapshot it exported), those writes come
    # from the log, after it.
    pg.execute(f"UPDATE {items} SET quantity = 100 WHERE id = 1")
    pg.execute(f"DELETE FROM {items} WHERE id = 2")
    pg.execute(f"INSERT INTO {items} VALUES (7, 'sku-7', 7, 8.75)")
    snapshot = _rows(reader, start, end)
    assert sorted(json.loads(r[3])["id"] for r in snapshot) == [1, 2, 3, 4, 5, 6]
    (sequence,) = {r[2] for r in snapshot}
    assert sequence == f"{end['exported']['lsn']}/0"  # the slot's consistent point
    assert "load" not in end  # one batch loaded the whole table
    reader.commit(end)
    caught_up, end = _batch(reader, end)
    assert sorted(json.loads(r[3])["id"] for r in caught_up) == [1, 2, 7]
    assert all(_seq(r[2]) > _seq(sequence) for r in caught_up)
    assert "exported" not in end and "watermarked" not in end  # let go once loaded
    reader.commit(end)
    snapshot += caught_up

    scd1 = autocdc.AutoCdcFlow(target=new_table("items"), keys=["id"])
    scd2 = autocdc.AutoCdcFlow(target=new_table("items_history"), keys=["id"], stored_as_scd_type=2)
    for flow in (scd1, scd2):
        _apply(spark, flow, snapshot, items, ITEMS)
    pg.execute(
        f"BEGIN; UPDATE {items} SET id = 30 WHERE id = 3; "  # a key that changes
        f"UPDATE {items} SET price = 9.99 WHERE id = 4; UPDATE {items} SET price = 10.99 "
        f"WHERE id = 4; COMMIT"
    )
    streamed, second = _batch(reader, end)
    # A crash before the commit replays the same batch: same rows, nothing lost.
    replayed = _rows(reader, end, second)
    assert replayed == streamed
    reader.commit(second)
    for flow in (scd1, scd2):
        _apply(spark, flow, streamed, items, ITEMS)
    _assert_mirrors(spark, pg, scd1.target, items)
    history = spark.table(scd2.target).where("id = 4").orderBy("__START_AT").collect()
    assert [str(r.price) for r in history] == ["5.00", "9.99", "10.99"]
    gone = spark.table(scd2.target).where("id IN (2, 3) AND __END_AT IS NULL").count()
    assert gone == 0
    # Every row that existed when capture began has its version from there.
    first = spark.table(scd2.target).groupBy("id").agg(F.min("__START_AT").alias("s"))
    assert {r.id for r in first.collect() if _at(r.s) == _seq(sequence)} == {1, 2, 3, 4, 5, 6}
    key_1 = spark.table(scd2.target).where("id = 1").orderBy("__START_AT").collect()
    assert [r.quantity for r in key_1] == [1, 100]
    reader.stop()


def test_truncate_and_bad_changes(spark, pg, new_table):
    items, _ = _tables(pg, "bad")
    pg.execute("CREATE TABLE notes_bad (id int PRIMARY KEY, body text, n int)")
    big = secrets.token_hex(20_000)  # stored out of line (TOAST), so an update may omit it
    pg.execute("INSERT INTO notes_bad VALUES (1, %s, 1), (2, 'short', 2)", (big,))
    pg.execute(f"INSERT INTO {items} VALUES (1, 'a', 1, 1)")
    reader = _reader(pg, "bad", f"{items},notes_bad")
    start = reader.initialOffset()
    snapshot, end = _batch(reader, start)
    reader.commit(end)
    pg.execute("UPDATE notes_bad SET n = 10 WHERE id = 1")  # body unchanged: not sent
    pg.execute("UPDATE notes_bad SET n = 20 WHERE id = 2")
    pg.execute(f"BEGIN; TRUNCATE {items}; INSERT INTO {items} VALUES (5, 'e', 5, 5); COMMIT")
    streamed, second = _batch(reader, end)
    reader.commit(second)
    rows = snapshot + streamed

    items_flow = autocdc.AutoCdcFlow(target=new_table("items"), keys=["id"])
    _apply(spark, items_flow, rows, items, ITEMS)
    _assert_mirrors(spark, pg, items_flow.target, items)
    # `n BOOLEAN` does not fit the numbers PostgreSQL sends: quarantined, never NULL.
    notes = autocdc.AutoCdcFlow(target=new_table("notes"), keys=["id"])
    _apply(spark, notes, rows, "notes_bad", "id INT, body STRING, n BOOLEAN")
    quarantined = spark.table(notes.quarantine_table).collect()
    assert {r.reason for r in quarantined} == {QUARANTINE_MALFORMED_RECORD}
    raws = sorted(json.loads(r.row)["_corrupt_record"] for r in quarantined)
    assert len(raws) == 4  # every row: n is a number (one update also lacks its body)
    toast = autocdc.AutoCdcFlow(target=new_table("notes_ok"), keys=["id"])
    _apply(spark, toast, rows, "notes_bad", "id INT, body STRING, n INT")
    (missing,) = spark.table(toast.quarantine_table).collect()
    assert (
        "REPLICA IDENTITY FULL" in json.loads(json.loads(missing.row)["_corrupt_record"])["reason"]
    )
    assert spark.table(toast.target).where("id = 1").first().n == 1  # kept, not guessed
    reader.stop()


def _seq(sequence: str) -> tuple[int, ...]:
    return tuple(int(part, 16) for part in sequence.split("/"))


def _at(struct) -> tuple[int, ...]:
    """A ``__START_AT`` of a change-row flow (hex sections, -1 where none) as :func:`_seq`."""
    return tuple(int(v) for v in struct if v != -1)


def test_an_initial_load_resumes_where_it_stopped(spark, pg, new_table):
    """Key ranges of 4 rows, writes between every batch (behind, inside and ahead of the
    load), a crash before each of two commits with more writes before the replay, a full
    restart of the reader: the targets equal the table, the history its committed order."""
    items, _ = _tables(pg, "resume")
    pg.execute(f"INSERT INTO {items} SELECT g, 's' || g, g, g FROM generate_series(1, 14) g")
    scd1 = autocdc.AutoCdcFlow(target=new_table("items"), keys=["id"])
    scd2 = autocdc.AutoCdcFlow(target=new_table("items_history"), keys=["id"], stored_as_scd_type=2)
    writes = iter(
        [
            f"UPDATE {items} SET quantity = 100 WHERE id IN (2, 13)",
            f"DELETE FROM {items} WHERE id = 6; INSERT INTO {items} VALUES (20, 'n', 1, 1)",
            f"UPDATE {items} SET sku = 'x' WHERE id = 5; UPDATE {items} SET id = 40 WHERE id = 9",
            f"UPDATE {items} SET quantity = 7 WHERE id = 1; DELETE FROM {items} WHERE id = 12",
        ]
        + [f"UPDATE {items} SET quantity = quantity + 1 WHERE id = {k}" for k in (3, 7, 11, 14)]
    )
    reader = _reader(pg, "resume", items, load_batch_rows="4")
    start, batches = reader.initialOffset(), 0
    while True:
        rows, end = _batch(reader, start)
        pg.execute(next(writes, "SELECT 1"))
        if batches in (1, 3):  # killed before the commit: a new process replays the batch
            reader.stop()
            pg.execute(next(writes, "SELECT 1"))
            reader = _reader(pg, "resume", items, load_batch_rows="4")
            rows = _rows(reader, start, end)
        for flow in (scd1, scd2):
            _apply(spark, flow, rows, items, ITEMS)
        reader.commit(end)
        batches += 1
        if end == start:
            break
        start = end
    assert batches >= 5  # 14 rows in ranges of 4, and a batch that finds nothing new
    _assert_mirrors(spark, pg, scd1.target, items)
    current = spark.table(scd2.target).where("__END_AT IS NULL").drop("__START_AT", "__END_AT")
    assert_df_equality(current, spark.table(scd1.target), ignore_row_order=True)

    def versions(key: int) -> list[tuple[str, int]]:
        rows = spark.table(scd2.target).where(f"id = {key}").orderBy("__START_AT").collect()
        return [(r.sku, r.quantity) for r in rows]

    assert versions(2) == [("s2", 2), ("s2", 100)]  # loaded, then updated: nothing doubled
    assert versions(13) == [("s13", 100)]  # updated before its range was read
    # Changed after the slot, before its range was read: its history starts at the change.
    assert versions(5) == [("x", 5)]
    reader.stop()


ACCT = "id BIGINT, v STRING"


def _history(spark, flow: autocdc.AutoCdcFlow) -> dict[int, list[tuple[str, tuple, bool]]]:
    """Each key's versions in order: value, start (as :func:`_seq`), still current."""
    found: dict[int, list[tuple[str, tuple, bool]]] = {}
    for r in spark.table(flow.target).orderBy("id", "__START_AT").collect():
        found.setdefault(r.id, []).append((r.v, _at(r["__START_AT"]), r["__END_AT"] is None))
    return found


def _drain(spark, reader, start: dict, flows, table: str) -> dict:
    """Micro-batches, each applied and committed, until one finds nothing new."""
    while True:
        rows, end = _batch(reader, start)
        for flow in flows:
            _apply(spark, flow, rows, table, ACCT)
        reader.commit(end)
        if end == start:
            return end
        start = end


def test_the_history_begins_with_every_row_as_it_was_when_capture_began(spark, pg, new_table):
    """Issue 31's reproduction, a range per row: key 1 changed after the slot's creation,
    before the load read it; key 3 deleted then, before its range was read. Read in the
    snapshot the slot exported, every row starts at the slot's point, and every change
    after it is one version."""
    pg.execute("CREATE TABLE acct (id bigint PRIMARY KEY, v text)")
    pg.execute("INSERT INTO acct VALUES (1, 'a'), (2, 'b'), (3, 'c')")
    reader = _reader(pg, "acct", "acct", load_batch_rows="1")
    scd2 = autocdc.AutoCdcFlow(target=new_table("acct"), keys=["id"], stored_as_scd_type=2)
    start = reader.initialOffset()
    rows, end = _batch(reader, start)  # created the slot, read key 1 as it was then
    point = _seq(f"{end['exported']['lsn']}/0")
    pg.execute("UPDATE acct SET v = 'a2' WHERE id = 1")
    pg.execute("DELETE FROM acct WHERE id = 3")
    _apply(spark, scd2, rows, "acct", ACCT)
    reader.commit(end)
    end = _drain(spark, reader, end, [scd2], "acct")
    pg.execute("UPDATE acct SET v = 'b2' WHERE id = 2")
    _drain(spark, reader, end, [scd2], "acct")
    history = _history(spark, scd2)
    assert [(v, at == point, live) for v, at, live in history[1]] == [
        ("a", True, False),
        ("a2", False, True),
    ]
    assert [(v, at == point, live) for v, at, live in history[2]] == [
        ("b", True, False),
        ("b2", False, True),
    ]
    assert [(v, at == point, live) for v, at, live in history[3]] == [("c", True, False)]
    reader.stop()


def test_a_query_that_starts_anew_makes_the_slot_anew(pg):
    """A slot found when a query plans its first batch (a full refresh dropped the
    checkpoint) gave that query nothing: it is made anew, and the load reads in its
    snapshot, at its point, instead of by watermarks."""
    pg.execute("CREATE TABLE anew (id bigint PRIMARY KEY, v text)")
    pg.execute("INSERT INTO anew VALUES (1, 'a')")
    first = _reader(pg, "anew", "anew")
    _, end = _batch(first, first.initialOffset())
    first.commit(end)
    first.stop()
    pg.execute("UPDATE anew SET v = 'b' WHERE id = 1")
    again = _reader(pg, "anew", "anew")
    rows, second = _batch(again, again.initialOffset())
    point = second["exported"]["lsn"]
    assert _seq(point) > _seq(end["exported"]["lsn"])
    assert [(json.loads(r[3])["v"], r[2]) for r in rows] == [("b", f"{point}/0")]
    assert "watermarked" not in second
    again.stop()


@pytest.mark.e2e
def test_a_server_that_refuses_replication_connections_loads_by_watermarks():
    """``max_wal_senders = 0`` (or a pooler that passes no replication connection): the
    slot is made over SQL, exports nothing, and the load goes by watermarks, which the
    offsets say, with why."""
    server = Server(wal_senders=0).start()
    try:
        server.execute("CREATE TABLE refused (id bigint PRIMARY KEY, v text)")
        server.execute("INSERT INTO refused VALUES (1, 'a')")
        reader = _reader(server, "refused", "refused")
        rows, end = _batch(reader, reader.initialOffset())
        assert "exported" not in end
        assert [json.loads(r[3])["v"] for r in rows] == ["a"]
        assert _seq(rows[0][2]) > _seq(end["lsn"])  # at the watermark written after the read
        reader.commit(end)
        _, later = _batch(reader, end)
        assert later["watermarked"] == {"public.refused": REFUSED}
        reader.stop()
    finally:
        server.stop()


@pytest.mark.parametrize("full", [False, True], ids=["key-identity", "replica-identity-full"])
def test_a_load_resumed_after_a_kill_falls_back_to_watermarks(spark, pg, new_table, full):
    """The process that held the exported snapshot dies after the first range: the rest
    loads by watermarks and the offsets say so. With ``REPLICA IDENTITY FULL`` a key
    updated or deleted before its range was read keeps the row it held before (from
    where the slot stood); without, its history starts at its change (a deleted key has
    none). SCD type 1 mirrors the table either way."""
    table = f"acct_{'full' if full else 'key'}"
    pg.execute(f"CREATE TABLE {table} (id bigint PRIMARY KEY, v text)")
    if full:
        pg.execute(f"ALTER TABLE {table} REPLICA IDENTITY FULL")
    pg.execute(f"INSERT INTO {table} SELECT g, 'v' || g FROM generate_series(1, 6) g")
    reader = _reader(pg, table, table, load_batch_rows="2")
    scd1 = autocdc.AutoCdcFlow(target=new_table("mirror"), keys=["id"])
    scd2 = autocdc.AutoCdcFlow(target=new_table("history"), keys=["id"], stored_as_scd_type=2)
    rows, end = _batch(reader, reader.initialOffset())  # keys 1 and 2, in the snapshot
    point = _seq(f"{end['exported']['lsn']}/0")
    for flow in (scd1, scd2):
        _apply(spark, flow, rows, table, ACCT)
    reader.commit(end)
    reader.stop()  # killed: the snapshot is gone with its connection
    pg.execute(f"UPDATE {table} SET v = 'v5b' WHERE id = 5; DELETE FROM {table} WHERE id = 6")
    pg.execute(f"UPDATE {table} SET v = 'v1b' WHERE id = 1")
    reader = _reader(pg, table, table, load_batch_rows="2")
    offset = _drain(spark, reader, end, [scd1, scd2], table)
    assert offset["watermarked"] == {f"public.{table}": RESTARTED}
    assert "exported" not in offset
    rows = pg.query(f"SELECT id, v FROM {table}")
    assert_df_equality(
        spark.table(scd1.target), spark.createDataFrame(rows, ACCT), ignore_row_order=True
    )
    starts = _history(spark, scd2)
    history = {k: [(v, live) for v, _, live in h] for k, h in starts.items()}
    assert history[1] == [("v1", False), ("v1b", True)]
    assert starts[1][0][1] == point  # read in the snapshot
    assert history[5] == ([("v5", False)] if full else []) + [("v5b", True)]
    assert history.get(6, []) == ([("v6", False)] if full else [])
    assert all(starts[k][0][1] > point for k in (3, 4))  # by watermarks: from their read on
    reader.stop()


def test_the_load_of_a_table_keyed_by_an_option_takes_rows_with_a_null_key(pg):
    """NULL sorts last in key order: it must not become a range's bound, or the rows
    before it in that range would be skipped. The flow quarantines the NULL-key row."""
    _, logs = _tables(pg, "nullkey")
    pg.execute(f"ALTER TABLE {logs} REPLICA IDENTITY FULL")
    pg.execute(f"INSERT INTO {logs} SELECT g, 'l' || g FROM generate_series(1, 5) g")
    pg.execute(f"INSERT INTO {logs} VALUES (NULL, 'no key')")
    reader = _reader(pg, "nullkey", logs, **{f"keys.{logs}": "id", "load_batch_rows": "2"})
    start, loaded = reader.initialOffset(), []
    while True:
        rows, end = _batch(reader, start)
        loaded += [json.loads(r[3])["id"] for r in rows]
        reader.commit(end)
        if end == start:
            break
        start = end
    assert sorted(loaded, key=lambda k: (k is None, k)) == [1, 2, 3, 4, 5, None]
    reader.stop()


def test_a_table_added_to_a_running_capture_is_loaded_beside_the_stream(spark, pg, new_table):
    items, _ = _tables(pg, "first")
    added, _ = _tables(pg, "added")
    for table in (items, added):
        pg.execute(f"INSERT INTO {table} SELECT g, 's' || g, g, g FROM generate_series(1, 5) g")
    reader = _reader(pg, "grow", items)
    flows = {t: autocdc.AutoCdcFlow(target=new_table(t), keys=["id"]) for t in (items, added)}

    def batch(start: dict) -> dict:
        rows, end = _batch(reader, start)
        for table, flow in flows.items():
            _apply(spark, flow, rows, table, ITEMS)
        reader.commit(end)
        return end

    offset = batch(reader.initialOffset())
    pg.execute(f"UPDATE {added} SET quantity = 50 WHERE id = 1")  # not captured yet
    offset = batch(offset)
    assert spark.table(flows[added].target).count() == 0
    reader.stop()
    # The option names one more table; the query goes on from its checkpoint.
    reader = _reader(pg, "grow", f"{items},{added}", load_batch_rows="2")
    offset = batch(offset)
    assert offset["load"]["table"] == f"public.{added}"
    pg.execute(f"UPDATE {added} SET quantity = 60 WHERE id = 5; DELETE FROM {added} WHERE id = 2")
    pg.execute(f"UPDATE {items} SET quantity = 70 WHERE id = 3")
    while "load" in offset:
        offset = batch(offset)
    offset = batch(offset)
    for table, flow in flows.items():
        _assert_mirrors(spark, pg, flow.target, table)
    reader.stop()


def test_a_row_reads_the_same_from_the_snapshot_and_from_the_log(spark, pg):
    """The initial load reads values with ::text, the log sends its own text form: both
    must type back to the same row (booleans are 'true' in one and 't' in the other)."""
    pg.execute(
        "CREATE TABLE kinds (id int PRIMARY KEY, flag bool, ratio float8, amount numeric(8,2),"
        " doc jsonb, at timestamptz, day date, note text)"
    )
    values = (
        "true, 'NaN', 12.50, '{\"a\": [1, 2]}', '2026-01-02 03:04:05.25+00', '2026-01-02', 'x\"y'"
    )
    pg.execute(f"INSERT INTO kinds VALUES (1, {values})")
    reader = _reader(pg, "kinds", "kinds")
    snapshot, end = _batch(reader, reader.initialOffset())
    reader.commit(end)
    pg.execute(f"INSERT INTO kinds VALUES (2, {values})")
    streamed, second = _batch(reader, end)
    reader.commit(second)
    reader.stop()
    schema = (
        "id INT, flag BOOLEAN, ratio DOUBLE, amount DECIMAL(8,2), doc STRING, at TIMESTAMP, "
        "day DATE, note STRING"
    )
    rows = spark.createDataFrame(snapshot + streamed, CHANGES_SCHEMA)
    typed = postgres_table(rows, "kinds", schema).drop("_CHANGE_SEQUENCE_NUMBER").collect()
    first, again = sorted(typed, key=lambda r: r.id)
    assert math.isnan(first.ratio) and math.isnan(again.ratio)  # NaN != NaN: compared apart
    assert first.asDict() | {"id": 2, "ratio": 0} == again.asDict() | {"ratio": 0}
    assert (first.flag, first.amount, first.note, first._corrupt_record) == (
        True,
        Decimal("12.50"),
        'x"y',
        None,
    )
    assert json.loads(first.doc) == {"a": [1, 2]}


def test_values_read_the_same_whatever_the_servers_zone_and_date_style(spark, pg, new_table):
    """A database whose defaults render dates and times another way (New York's zone,
    SQL day-month order) reads exactly as one in UTC/ISO, from the snapshot and from the
    log; a value Spark cannot hold (BC, infinity) is quarantined with the range it
    misses, never typed to NULL or to another instant."""
    pg.execute("CREATE DATABASE zoned")
    pg.execute("ALTER DATABASE zoned SET timezone = 'America/New_York'")
    pg.execute("ALTER DATABASE zoned SET DateStyle = 'SQL, DMY'")
    pg.execute("ALTER DATABASE zoned SET IntervalStyle = 'sql_standard'")
    pg.execute("ALTER DATABASE zoned SET extra_float_digits = 0")
    zoned = pg.database("zoned")
    zoned.execute(
        "CREATE TABLE times (id int PRIMARY KEY, at timestamptz, local timestamp, day date)"
    )
    good = [
        "'0001-01-01 00:00:00+00', '0001-01-01 00:00:00', '0999-12-31'",
        "'2024-03-10 07:30:00.5+00', '2024-03-10 02:30:00', '2024-03-10'",
    ]
    bad = [
        "'0044-03-15 12:00:00+00 BC', NULL, NULL",
        "NULL, NULL, '-infinity'",
        "'infinity', NULL, NULL",
    ]
    values = good + bad
    zoned.execute(
        "INSERT INTO times VALUES " + ", ".join(f"({i}, {v})" for i, v in enumerate(values))
    )
    reader = PostgresStreamReader(
        Config.parse({"dsn": zoned.dsn, "slot": "zoned", "tables": "times"})
    )
    snapshot, end = _batch(reader, reader.initialOffset())
    reader.commit(end)
    zoned.execute(
        "INSERT INTO times VALUES " + ", ".join(f"({10 + i}, {v})" for i, v in enumerate(values))
    )
    streamed, second = _batch(reader, end)
    reader.commit(second)
    reader.stop()

    flow = autocdc.AutoCdcFlow(target=new_table("times"), keys=["id"])
    schema = "id INT, at TIMESTAMP, local TIMESTAMP_NTZ, day DATE"
    _apply(spark, flow, snapshot + streamed, "times", schema)
    # Compared as Spark's text (its session zone is UTC): a Python datetime of year 1
    # would be shifted by the test machine's zone.
    as_text = ["id", "string(at) AS at", "string(local) AS local", "string(day) AS day"]
    got = {
        r.id: (r.at, r.local, r.day)
        for r in spark.table(flow.target).selectExpr(*as_text).collect()
    }
    utc = [
        ("0001-01-01 00:00:00", "0001-01-01 00:00:00", "0999-12-31"),
        ("2024-03-10 07:30:00.5", "2024-03-10 02:30:00", "2024-03-10"),
    ]
    assert got == {0: utc[0], 1: utc[1], 10: utc[0], 11: utc[1]}
    quarantined = spark.table(flow.quarantine_table).collect()
    reasons = sorted(
        json.loads(json.loads(r.row)["_corrupt_record"])["reason"] for r in quarantined
    )
    assert reasons == sorted(
        f"value {text!r} is outside the range of Spark's {kind} (0001-01-01 to 9999-12-31)"
        for text, kind in [
            ("0044-03-15 12:00:00+00 BC", "TIMESTAMP"),
            ("-infinity", "DATE"),
            ("infinity", "TIMESTAMP"),
        ]
        for _ in range(2)  # from the snapshot and from the log
    )


def test_a_snapshot_and_the_capture_of_one_table_make_one_target(spark, pg, new_table, tmp_path):
    """Issue 62: a table read whole by a STATELESS extraction at a known LSN (no writer
    runs while it is read, so that LSN is its position), and the capture of the same
    table, into one SCD type 1 target, the snapshot applied first and every captured
    change after it: the target equals the table. The changes committed before the
    snapshot lose to it (it holds their outcome), those after win, and a key deleted
    before it stays deleted (other arrival orders: tests/engine/test_snapshot_shared.py)."""
    items, _ = _tables(pg, "shared")
    pg.execute(f"INSERT INTO {items} SELECT g, 'sku-' || g, g, g FROM generate_series(1, 6) g")
    reader = _reader(pg, "shared", items)
    start = reader.initialOffset()
    end = reader.latestOffset(start, None)  # capture begins here: the slot exists
    captured = _rows(reader, start, end)
    reader.commit(end)
    pg.execute(
        f"UPDATE {items} SET quantity = 10 WHERE id = 1; DELETE FROM {items} WHERE id = 2;"
        f"INSERT INTO {items} VALUES (7, 'sku-7', 7, 7)"
    )
    ((lsn,),) = pg.query("SELECT pg_current_wal_insert_lsn()::text")
    stateless = Extraction(name="src", dsn=pg.dsn, table=items, strategy="STATELESS")
    read = extracting.step(tmp_path, stateless).run(
        spark, ExtractionOptions(), lambda df, _: df.localCheckpoint()
    )
    pg.execute(
        f"UPDATE {items} SET sku = 'late' WHERE id = 7; DELETE FROM {items} WHERE id = 3;"
        f"INSERT INTO {items} VALUES (2, 'again', 2, 2)"
    )
    while True:
        rows, after = _batch(reader, end)
        reader.commit(after)
        captured += rows
        if after == end:
            break
        end = after
    reader.stop()

    target = new_table("shared_items")
    snapshot = autocdc.AutoCdcSnapshotFlow(
        target=target, keys=["id"], sequence_by=autocdc.hex_sequence(F.lit(lsn))
    )
    snapshot.apply(read.result, version=1)
    # Every captured change after it: those committed before the snapshot arrive late.
    changes = autocdc.AutoCdcFlow(target=target, keys=["id"], snapshot_target=True)
    _apply(spark, changes, captured, items, ITEMS)
    _assert_mirrors(spark, pg, target, items)
