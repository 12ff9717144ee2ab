"""Extraction through Spark's JDBC source (autocdc/sources/jdbcextract.py), against SQLite
files the tests write with Python's sqlite3: no server, the same read path as any database
(MariaDB's is tests/sources/test_jdbc_mariadb.py)."""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import extracting
import pytest
from extracting import collect
from projects import run, write_project

from autocdc.pipelines.declare import project
from autocdc.pipelines.execute import eventlog
from autocdc.pipelines.execute.checkpoint import FILE, CheckpointFile
from autocdc.pipelines.operations import overview
from autocdc.sources import jdbcextract
from autocdc.sources.errors import (
    BadBatchError,
    BatchFailedError,
    PlanFailedError,
    SourceOptionError,
)
from autocdc.sources.extract import Batch, Extraction, ExtractionOptions


def _db(path: Path, *statements: str, rows: tuple = ()) -> str:
    """Run ``statements`` on the SQLite file at ``path`` (``rows`` go to the last one, as
    executemany's parameters); the file's JDBC URL."""
    with sqlite3.connect(path) as conn:
        for sql in statements[:-1] if rows else statements:
            conn.execute(sql)
        if rows:
            conn.executemany(statements[-1], rows)
    return f"jdbc:sqlite:{path}"


def test_literals_and_predicates_read_the_same_in_every_database():
    batch = Batch("a >= %s AND b = %s AND c LIKE 'x%%' AND d = %s", (Decimal("1.50"), "it's", None))
    assert jdbcextract.predicate(batch) == "a >= 1.50 AND b = 'it''s' AND c LIKE 'x%' AND d = NULL"
    assert jdbcextract.quoted_table('shop."My Items"') == '"shop"."My Items"'
    assert jdbcextract.literal(["eu", 'a"b', None]) == """'{"eu","a\\"b",NULL}'"""
    assert Extraction(name="s", dsn="jdbc:sqlite:x", table="t", strategy="STATELESS").url
    with pytest.raises(BadBatchError):
        jdbcextract.predicate(Batch("a = %s AND b = %s", (1,)))
    with pytest.raises(SourceOptionError) as refused:
        Extraction(name="s", url="jdbc:sqlite:x", dsn="dbname=x", table="t", strategy="STATELESS")
    assert "Give one connection" in str(refused.value)
    with pytest.raises(SourceOptionError, match="num_partitions"):
        Extraction(name="s", url="jdbc:sqlite:x", table="t", strategy="STATELESS", num_partitions=4)
    with pytest.raises(SourceOptionError, match="password_env"):
        Extraction(name="s", dsn="dbname=x", table="t", strategy="STATELESS", password_env="P")


def test_watermark_reads_on_executors_checkpoints_and_rereads_ties(spark, tmp_path):
    """The first run reads all 40 rows in 4 partitions of ``id`` (in 2 tasks with
    ``max_concurrency=2``); the checkpoint is the greatest ``updated_at`` as text; a row
    written later at that same time (a coarse clock) and a newer one are read by the next
    run, with the ties read again."""
    rows = [(i, f"n{i}", f"2024-05-01 10:00:{i % 20:02d}") for i in range(1, 41)]
    url = _db(
        tmp_path / "shop.db",
        "CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT, updated_at TEXT)",
        "INSERT INTO items VALUES (?, ?, ?)",
        rows=tuple(rows),
    )
    src = Extraction(
        name="items_src",
        url=url,
        table="items",
        cdc_order=["updated_at"],
        partition_column="id",
        num_partitions=4,
    )
    step = extracting.step(tmp_path, src)
    done = step.run(
        spark, ExtractionOptions(), lambda df, _: (df.dtypes, collect(df), len(df.inputFiles()))
    )
    dtypes, got, files = done.result
    assert files == 4  # a task per partition: 4 queries at once, as cores allow
    assert dtypes == [
        ("id", "int"),
        ("name", "string"),
        ("updated_at", "string"),
        ("_corrupt_record", "string"),
    ]
    assert got == sorted(((*r, None) for r in rows), key=repr)
    assert (done.rows, done.checkpoint) == (40, {"updated_at": "2024-05-01 10:00:19"})
    assert json.loads((step.checkpoints / FILE).read_text())["checkpoint"] == done.checkpoint

    _db(
        tmp_path / "shop.db",
        "INSERT INTO items VALUES (41, 'tie', '2024-05-01 10:00:19')",
        "INSERT INTO items VALUES (42, 'new', '2024-05-01 10:00:20')",
    )
    again = step.run(spark, ExtractionOptions(), collect)
    assert [r[:2] for r in again.result] == [(19, "n19"), (39, "n39"), (41, "tie"), (42, "new")]
    assert again.checkpoint == {"updated_at": "2024-05-01 10:00:20"}
    bounded = extracting.step(tmp_path, src, "bounded")  # 2 tasks, 2 queries each in turn
    files = bounded.run(spark, ExtractionOptions(max_concurrency=2), lambda df, _: df.inputFiles())
    assert len(files.result) == 2 and files.rows == 42


def test_a_limit_bounds_each_run_and_a_lookback_reads_behind_the_checkpoint(spark, tmp_path):
    """``limit=4`` through JDBC: the edge (Spark's sort and limit over the read) is the
    4th value past the checkpoint, every tie at it read; a numeric ``lookback=15`` then
    also reads a row written below the checkpoint, within 15 of it."""
    rows = [(g, 10 if g <= 5 else 20 if g <= 12 else 30) for g in range(1, 16)] + [(16, None)]
    url = _db(
        tmp_path / "b.db",
        "CREATE TABLE backfill (id INTEGER PRIMARY KEY, at INTEGER)",
        "INSERT INTO backfill VALUES (?, ?)",
        rows=tuple(rows),
    )
    src = Extraction(name="b", url=url, table="backfill", cdc_order=["at"], limit=4)
    step = extracting.step(tmp_path, src)

    def once(step=step) -> tuple[list[int], int]:
        done = step.run(spark, ExtractionOptions(), collect)
        return sorted(r[0] for r in done.result), done.checkpoint["at"]

    assert once() == ([1, 2, 3, 4, 5, 16], 10)  # the 4th value past nothing, 10, its ties
    assert once() == (list(range(1, 13)), 20)  # ties at 10 again, and all seven at 20
    _db(tmp_path / "b.db", "INSERT INTO backfill VALUES (17, 20), (18, 40), (19, 25)")
    assert once() == ([*range(6, 16), 17, 19], 30)  # 25, 30, 30, 30: 40 waits
    assert once() == ([13, 14, 15, 18], 40)
    back = Extraction(name="l", url=url, table="backfill", cdc_order=["at"], lookback=15)
    behind = extracting.step(tmp_path, back, "l")
    assert once(behind)[1] == 40
    _db(tmp_path / "b.db", "INSERT INTO backfill VALUES (20, 26), (21, 24)")
    assert once(behind) == ([13, 14, 15, 18, 19, 20], 40)  # 25 and on: 21 is 16 behind


class EveryTenth:
    """A CUSTOM cursor: batches by ``id`` ranges past the checkpoint; ``fold`` runs on the
    executors, per partition."""

    def batches(self, checkpoint):
        start = checkpoint or 0
        return [
            Batch("id > %s AND id <= %s", (start + 10 * i, start + 10 * (i + 1))) for i in (0, 1)
        ]

    def seed(self, checkpoint):
        return checkpoint or 0

    def fold(self, acc, row):
        return max(acc, row["id"])

    def merge(self, a, b):
        return max(a, b)


def test_a_custom_cursor_folds_on_the_executors_and_declared_types_quarantine_misfits(
    spark, tmp_path
):
    url = _db(
        tmp_path / "kinds.db",
        "CREATE TABLE kinds (id INTEGER PRIMARY KEY, qty TEXT, price TEXT)",
        "INSERT INTO kinds VALUES (?, ?, ?)",
        rows=tuple((i, "many" if i == 7 else str(i), f"{i}.25") for i in range(1, 26)),
    )
    src = Extraction(
        name="kinds_src",
        url=url,
        table="kinds",
        strategy="CUSTOM",
        cursor=EveryTenth(),
        columns="id BIGINT, qty INT, price DECIMAL(10,2)",
    )
    step = extracting.step(tmp_path, src)
    done = step.run(spark, ExtractionOptions(), lambda df, _: (df.dtypes, collect(df)))
    dtypes, got = done.result
    assert dtypes[:3] == [("id", "bigint"), ("qty", "int"), ("price", "decimal(10,2)")]
    assert (done.rows, done.batches, done.checkpoint) == (20, 2, 20)
    (bad,) = [r for r in got if r[3] is not None]  # "many" is no INT: quarantined, not NULL
    assert json.loads(bad[3]) == {"id": 7, "qty": "many", "price": "7.25"}
    assert (2, 2, Decimal("2.25"), None) in got
    assert step.run(spark, ExtractionOptions(), collect).checkpoint == 25


def test_misconfigurations_fail_before_anything_is_read_with_a_fix(spark, tmp_path):
    url = _db(tmp_path / "x.db", "CREATE TABLE t (id INTEGER, at TEXT)")
    cases = [
        (dict(url=url, table="nope"), "table", "Check the URL, the table's name"),
        (dict(url=url, table="t", cdc_order=["missing"]), "cdc_order", "Name columns"),
        (
            dict(url=url, table="t", partition_column="at", num_partitions=2),
            "partition_column",
            "numeric",
        ),
        (dict(url="jdbc:oracle:thin:@h:1521/x", table="t"), "url", "properties={'driver'"),
        (dict(url=url, table="t", password_env="AUTOCDC_NO_SUCH"), "password_env", "Set "),
    ]
    for given, option, fix in cases:
        src = Extraction(name="bad", **({"cdc_order": ["at"]} | given))
        with pytest.raises(SourceOptionError) as refused:
            extracting.step(tmp_path, src).run(spark, ExtractionOptions(), collect)
        assert refused.value.params["option"] == option and fix in str(refused.value)


def test_a_failed_read_is_read_again_and_when_every_retry_fails_the_checkpoint_stays(
    spark, tmp_path, monkeypatch
):
    """The first attempt stages its rows, then fails: the second reads them again, and
    the run applies each row once. Then every attempt fails: the stored checkpoint stays
    as it was, byte for byte."""
    url = _db(
        tmp_path / "f.db", "CREATE TABLE t (id INTEGER, at TEXT)", "INSERT INTO t VALUES (1, 'x')"
    )
    said, real, calls, failing = [], jdbcextract.read, [], {1}

    def flaky(spark, source, table, batches, path, most):
        calls.append(path)
        rows = real(spark, source, table, batches, path, most)  # staged, then lost
        if len(calls) in failing:
            raise OSError("connection reset")
        return rows

    monkeypatch.setattr(jdbcextract, "read", flaky)
    src = Extraction(name="f", url=url, table="t", cdc_order=["at"])
    step = extracting.step(tmp_path, src, say=said.append)
    done = step.run(spark, ExtractionOptions(retries=1), collect)
    assert (done.result, done.checkpoint) == ([(1, "x", None)], {"at": "x"})
    assert "the read failed (OSError: connection reset); trying again (2 of 2)" in said[0]
    assert [p.name for p in calls] == ["jdbc-attempt-1", "jdbc-attempt-2"]

    stored = (step.checkpoints / FILE).read_bytes()
    _db(tmp_path / "f.db", "INSERT INTO t VALUES (2, 'y')")
    failing |= {3, 4}
    with pytest.raises(BatchFailedError) as failed:
        step.run(spark, ExtractionOptions(retries=1), collect)
    assert (
        failed.value.params["attempts"] == 2 and "connection reset" in failed.value.params["error"]
    )
    assert (step.checkpoints / FILE).read_bytes() == stored

    broken = Extraction(name="g", url=url, table="t", strategy="STATELESS", where="no_such > 0")
    monkeypatch.setattr(jdbcextract, "read", real)
    with pytest.raises(BatchFailedError) as failed:
        extracting.step(tmp_path, broken, "g").run(spark, ExtractionOptions(retries=1), collect)
    assert "no_such" in failed.value.params["error"]  # the database's words


@contextlib.contextmanager
def locked(db: Path) -> Iterator[None]:
    """The SQLite file locked by another connection, as a busy database's writer holds it:
    a reader waits for the source's ``busy_timeout``, then fails with SQLITE_BUSY."""
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        conn.execute("BEGIN EXCLUSIVE")
        yield
    finally:
        conn.close()


def test_timed_out_queries_are_retried_and_a_lag_lookup_that_keeps_failing_only_loses_the_lag(
    spark, tmp_path, monkeypatch
):
    """issue 64, through JDBC: each kind of query (the newest values, a limit's edge, a
    batch's ``partition_column`` range, the read) meets a locked database once and times
    out: each is sent again and the run reads as if nothing had happened. A lag lookup
    that times out on every attempt leaves the lag unknown and the run goes on; an edge
    that does fails the run with AUTOCDC_EXTRACT_PLAN_FAILED, the checkpoint kept."""
    db = tmp_path / "busy.db"
    url = _db(
        db,
        "CREATE TABLE t (id INTEGER PRIMARY KEY, at INTEGER)",
        "INSERT INTO t VALUES (?, ?)",
        rows=tuple((i, 10 * ((i + 1) // 2)) for i in range(1, 7)),
    )
    busy = Extraction(name="b", url=url, table="t", cdc_order=["at"], limit=3,
                      partition_column="id", num_partitions=2,
                      properties={"busy_timeout": "100"})  # fmt: skip
    said: list[str] = []
    step = extracting.step(tmp_path, busy, say=said.append)
    timeouts = extracting.Timeouts(monkeypatch, jdbcextract, lambda: locked(db))
    mirror: dict[int, tuple] = {}

    def run():
        done = step.run(spark, ExtractionOptions(retries=1), collect)
        mirror.update({r[0]: r[:2] for r in done.result})
        return done

    def table() -> dict[int, tuple]:
        with sqlite3.connect(db) as conn:
            return {r[0]: r for r in conn.execute("SELECT id, at FROM t")}

    timeouts.inject(newest=1, edge=1, _ranges=1)
    first = run()
    assert timeouts.seen == ["newest", "edge", "_ranges"]
    retried = [s for s in said if "SQLITE_BUSY" in s and "trying again (2 of 2)" in s]
    assert len(retried) == 3
    assert (sorted(mirror), first.checkpoint, first.lag_unknown) == ([1, 2, 3, 4], {"at": 20}, None)

    timeouts.inject(newest=2, read=1)
    second = run()
    assert timeouts.seen[3:] == ["newest", "newest", "read"]
    assert second.checkpoint == {"at": 30} and mirror == table()
    assert "SQLITE_BUSY" in second.lag_unknown
    assert CheckpointFile(step.checkpoints).last_run()["lag_unknown"] == second.lag_unknown

    stored = (step.checkpoints / FILE).read_bytes()
    timeouts.inject(edge=2)
    with pytest.raises(PlanFailedError) as failed:
        run()
    assert failed.value.error_class == "AUTOCDC_EXTRACT_PLAN_FAILED"
    assert failed.value.params["attempts"] == 2 and "SQLITE_BUSY" in failed.value.params["error"]
    assert (step.checkpoints / FILE).read_bytes() == stored


PIPELINE = """
from autocdc import pipelines as dp

dp.create_extraction_source(name="items_src", url="{url}", table="items",
                            cdc_order=["updated_at"], password_env="SHOP_PASSWORD",
                            properties=dict(busy_timeout="100"))
dp.create_streaming_table("latest")
dp.create_auto_cdc_flow(target="latest", source="items_src", keys=["id"],
                        sequence_by="updated_at")
dp.create_streaming_table("history")
dp.create_auto_cdc_flow(target="history", source="items_src", keys=["id"],
                        sequence_by="updated_at", stored_as_scd_type=2)
dp.create_streaming_table("by_read")
dp.create_auto_cdc_flow(target="by_read", source="items_src", keys=["id"])
"""


def test_a_pipeline_mirrors_the_table_a_row_rewritten_in_one_tick_included(
    spark, tmp_path, new_table, monkeypatch
):
    """issue 35's reproduction through JDBC: a row rewritten at the same ``updated_at``
    (two writes in one tick) ends as the table holds it, not as the greater row, in SCD
    type 1 and 2, and without ``sequence_by``; the password never reaches the pipeline's
    storage (event log, checkpoints, status). The second run's lag lookups time out on
    every attempt (issue 64): the run goes on, and status and the event log say the lag
    is unknown."""
    monkeypatch.setenv("SHOP_PASSWORD", "s3cret-never-logged")
    db = tmp_path / "shop.db"
    url = _db(
        db,
        "CREATE TABLE items (id INTEGER PRIMARY KEY, price NUMERIC, updated_at TEXT)",
        "INSERT INTO items VALUES (111, 84.06, '2026-01-01 08:00:00'), "
        "(112, 1, '2026-01-01 07:00:00')",
    )
    database = new_table("jdbc_mirror")
    root = tmp_path / "project"
    spec = write_project(root, database, {"flow.py": PIPELINE.replace("{url}", url)})
    run(spark, spec)
    _db(
        db, "UPDATE items SET price = price * -1, updated_at = '2026-01-01 08:00:00' WHERE id = 111"
    )
    timeouts = extracting.Timeouts(monkeypatch, jdbcextract, lambda: locked(db))
    timeouts.inject(newest=6)  # three flows, two attempts each
    run(spark, spec)
    assert timeouts.seen == ["newest"] * 6
    loaded = project.load(spec)
    flows = overview.status(loaded)["flows"]
    assert all(f["extraction"]["lag_unknown"] for f in flows)
    assert {overview.describe_extraction(f["extraction"]).split("; ")[1] for f in flows} == {
        "lag unknown"
    }
    batches = eventlog.read(spark, loaded).where("event_type = 'batch'").orderBy("event_time")
    positions = [json.loads(r.source_position)[0] for r in batches.collect()]
    assert [p["lag_unknown"] is None for p in positions] == [True] * 3 + [False] * 3
    for target in ("latest", "history", "by_read"):
        rows = spark.table(f"{database}.{target}")
        if target == "history":
            assert rows.count() == 3  # 111's two versions
            rows = rows.where("__END_AT IS NULL")
        got = sorted((r.id, float(r.price)) for r in rows.collect())
        assert got == [(111, -84.06), (112, 1.0)], target
    written = [p.read_bytes() for p in (root / "storage").rglob("*") if p.is_file()]
    assert written and not any(b"s3cret-never-logged" in w for w in written)


@contextlib.contextmanager
def zones(spark, jvm: str, session: str) -> Iterator[None]:
    """The JVM's default zone and Spark's session zone set for a while, as on a host whose
    clock is in ``jvm`` with a session configured for ``session``."""
    zone = spark.sparkContext._jvm.java.util.TimeZone
    jvm_before, session_before = zone.getDefault(), spark.conf.get("spark.sql.session.timeZone")
    zone.setDefault(zone.getTimeZone(jvm))
    spark.conf.set("spark.sql.session.timeZone", session)
    try:
        yield
    finally:
        zone.setDefault(jvm_before)
        spark.conf.set("spark.sql.session.timeZone", session_before)


def test_a_zoneless_timestamp_is_checkpointed_as_the_database_holds_it(spark, tmp_path):
    """A DATETIME column read by a JVM in Los Angeles, Spark's session in UTC: the driver
    takes 11:00 as Los Angeles' 11:00, and the session would write that as 18:00, a
    checkpoint seven hours ahead of the column, which a later run's predicate compares in
    the database: the row written at 12:00 after the first run would be skipped. The read
    is pinned to the JVM's zone, so the checkpoint is 11:00 and the next run reads it."""
    # SQLite keeps a DATETIME as text and compares it as text: written as the checkpoint
    # writes it, so the predicate's `>=` meets the tie at 11:00 (see docs/sources.md).
    url = _db(
        tmp_path / "zone.db",
        "CREATE TABLE events (id INTEGER PRIMARY KEY, at DATETIME)",
        "INSERT INTO events VALUES (?, ?)",
        rows=((1, "2024-05-01 10:00:00.000000"), (2, "2024-05-01 11:00:00.000000")),
    )
    src = Extraction(name="z", url=url, table="events", cdc_order=["at"])
    step = extracting.step(tmp_path, src)
    with zones(spark, "America/Los_Angeles", "UTC"):
        first = step.run(spark, ExtractionOptions(), lambda df, _: df.dtypes)
        assert ("at", "timestamp") in first.result  # typed by the driver, not text
        assert first.checkpoint == {"at": "2024-05-01 11:00:00.000000"}
        _db(tmp_path / "zone.db", "INSERT INTO events VALUES (3, '2024-05-01 12:00:00.000000')")
        second = step.run(spark, ExtractionOptions(), collect)
        assert [r[0] for r in second.result] == [2, 3]  # the tie at 11:00, and the new row
        assert second.checkpoint == {"at": "2024-05-01 12:00:00.000000"}
        assert spark.conf.get("spark.sql.session.timeZone") == "UTC"  # restored
