"""Incremental extraction (autocdc/sources/extract.py, pgextract.py, staging.py and
autocdc/pipelines/execute/extraction.py).

Planning, options, refusals, checkpoint folding and the order batches complete in are pure
Python. The step itself runs against a real PostgreSQL server (tests/support/pgserver.py) with an
``apply`` that only collects the rows (no Delta): types, scope and partitions, STATELESS,
retries and failures, the checkpoint kept or moved, staging, and the source's lease. The
pipeline end to end, killed, is tests/sources/test_extract_kill.py.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from datetime import datetime
from decimal import Decimal

import extracting
import psycopg
import pytest
from extracting import collect
from hypothesis import given, settings
from hypothesis import strategies as st
from pgserver import Server
from processes import start_holder
from projects import run, write_project

from autocdc import AutoCdcFlow
from autocdc.engine.errors import DefinitionChangedError
from autocdc.pipelines import cli
from autocdc.pipelines.declare import project
from autocdc.pipelines.errors import PipelineDefinitionError
from autocdc.pipelines.execute.checkpoint import FILE, CheckpointFile
from autocdc.pipelines.execute.extraction import LEASES, STAGING, Extracted, Reader
from autocdc.pipelines.operations import overview
from autocdc.sources import extract, pgextract
from autocdc.sources.errors import (
    BadBatchError,
    BatchFailedError,
    CheckpointNotJsonError,
    CursorHookMissingError,
    ExtractionChangedError,
    NoCdcOrderError,
    PlanFailedError,
    SourceLockedError,
    SourceOptionError,
)
from autocdc.sources.extract import Batch, Extraction, ExtractionOptions

DSN = "host=db dbname=shop"


def source(**options) -> Extraction:
    return Extraction(**{"name": "src", "dsn": DSN, "table": "items", **options})


class Marks:
    """A CUSTOM cursor: one watermark per region, one batch per region known plus one for
    the others; merge keeps each region's greater mark."""

    def batches(self, checkpoint):
        marks = checkpoint or {}
        known = [Batch("region = %s AND at >= %s", (r, m)) for r, m in sorted(marks.items())]
        return [*known, Batch("NOT (region = ANY(%s))", (sorted(marks),))]

    def seed(self, checkpoint):
        return dict(checkpoint or {})

    def fold(self, acc, row):
        acc[row["region"]] = max(acc.get(row["region"], row["at"]), row["at"])
        return acc

    def merge(self, a, b):
        return {r: max(m for m in (a.get(r), b.get(r)) if m is not None) for r in a.keys() | b}


# --- pure: declarations, options, planning, folding --------------------------------------


def test_options_resolve_whole_from_the_run_then_the_flow_then_the_source():
    """The first set wins and replaces the others entirely: what it leaves out takes the
    defaults, not a lower level's value."""
    run_level = ExtractionOptions(retries=3)
    flow_level = ExtractionOptions(max_concurrency=4, staging=True)
    source_level = ExtractionOptions(max_concurrency=8, page_rows=5)
    assert extract.resolve_options(run_level, flow_level, source_level) == run_level
    resolved = extract.resolve_options(None, flow_level, source_level)
    assert resolved == flow_level and resolved.page_rows == ExtractionOptions().page_rows
    assert extract.resolve_options(None, None, source_level) == source_level
    assert extract.resolve_options(None, None, None) == ExtractionOptions()
    # The run's options on the command line: one set, as written.
    assert cli._extract_options("retries=2, staging=true") == ExtractionOptions(
        retries=2, staging=True
    )


def test_retries_are_clamped_to_1_to_5():
    assert ExtractionOptions().retries == 1
    assert [ExtractionOptions(retries=n).retries for n in (-1, 0, 1, 3, 5, 6, 100)] == [
        1,
        1,
        1,
        3,
        5,
        5,
        5,
    ]
    with pytest.raises(SourceOptionError) as refused:
        ExtractionOptions(max_concurrency=0)
    assert refused.value.params["option"] == "max_concurrency"


class NoMerge:
    def batches(self, checkpoint):
        return [Batch()]

    def seed(self, checkpoint):
        return None

    def fold(self, acc, row):
        return None


@pytest.mark.parametrize(
    ("options", "error", "params"),
    [
        ({}, NoCdcOrderError, {"source": "src"}),
        ({"strategy": "watermark", "cdc_order": []}, NoCdcOrderError, {"source": "src"}),
        (
            {"strategy": "CUSTOM", "cursor": NoMerge},
            CursorHookMissingError,
            {"missing": ["merge"], "cursor": "NoMerge"},
        ),
        (
            {"strategy": "CUSTOM"},
            CursorHookMissingError,
            {"missing": ["batches", "seed", "fold", "merge"], "cursor": "none given"},
        ),
        ({"strategy": "STATELESS", "cdc_order": "at"}, SourceOptionError, {"option": "cdc_order"}),
        ({"cdc_order": "at", "cursor": Marks}, SourceOptionError, {"option": "cursor"}),
        ({"strategy": "INCREMENTAL"}, SourceOptionError, {"option": "strategy"}),
        ({"cdc_order": ["at", 1]}, SourceOptionError, {"option": "cdc_order"}),
        ({"strategy": "STATELESS", "lookback": 5}, SourceOptionError, {"option": "lookback"}),
        ({"cdc_order": "at", "lookback": "30 parsecs"}, SourceOptionError, {"option": "lookback"}),
        ({"cdc_order": "at", "lookback": -1}, SourceOptionError, {"option": "lookback"}),
        ({"cdc_order": "at", "lookback": True}, SourceOptionError, {"option": "lookback"}),
        ({"cdc_order": ["at", "v"], "limit": 10}, SourceOptionError, {"option": "limit"}),
        ({"cdc_order": "at", "limit": 0}, SourceOptionError, {"option": "limit"}),
        ({"strategy": "STATELESS", "limit": 10}, SourceOptionError, {"option": "limit"}),
    ],
)
def test_declarations_that_cannot_work_are_refused(options, error, params):
    with pytest.raises(error) as refused:
        source(**options)
    assert params.items() <= refused.value.params.items()


def test_plan_pushes_the_predicate_into_every_partition_and_reads_a_batch_once():
    watermark = source(
        cdc_order=["at", "remaining DESC"],
        where="tenant = 'eu'",
        partitions=["id % 2 = 0", "id % 2 = 1", "id % 2 = 0"],  # one given twice
    )
    cursor = watermark.run_cursor()
    first = extract.plan(watermark, cursor, None)  # the first run: everything in scope
    assert [(b.where, b.params) for b in first] == [
        ("(tenant = 'eu') AND (id %% 2 = 0)", ()),
        ("(tenant = 'eu') AND (id %% 2 = 1)", ()),
    ]
    later = extract.plan(watermark, cursor, {"at": "2024-05-01 10:00:00+00", "remaining": None})
    assert [b.where for b in later] == [
        '(("at" >= %s OR "remaining" IS NOT NULL) AND (tenant = \'eu\')) AND (id %% 2 = 0)',
        '(("at" >= %s OR "remaining" IS NOT NULL) AND (tenant = \'eu\')) AND (id %% 2 = 1)',
    ]
    assert {b.params for b in later} == {("2024-05-01 10:00:00+00",)}
    # A CUSTOM cursor's own repeats collapse too, strings are predicates, others refused.
    custom = source(strategy="CUSTOM", cursor=Marks)
    twice = type("Twice", (Marks,), {"batches": lambda self, cp: ["a = 1", Batch("a = 1")]})()
    assert extract.plan(custom, twice, None) == [Batch("a = 1")]
    wrong = type("Wrong", (Marks,), {"batches": lambda self, cp: [("a = %s", (1,))]})()
    with pytest.raises(BadBatchError):
        extract.plan(custom, wrong, None)


def test_watermark_folds_per_column_max_ascending_and_min_descending():
    cursor = source(cdc_order=["at", "remaining DESC"]).run_cursor()
    rows = [
        {"at": "2024-05-01 10:00:00+00", "remaining": 7},
        {"at": "2024-05-01 10:00:00.5+00", "remaining": None},
        {"at": None, "remaining": 3},
    ]
    one = cursor.seed(None)
    for row in rows[:2]:
        one = cursor.fold(one, row)
    two = cursor.fold(cursor.seed(None), rows[2])
    expected = {"at": "2024-05-01 10:00:00.5+00", "remaining": 3}
    assert cursor.merge(one, two) == cursor.merge(two, one) == expected
    # A later run starts from the checkpoint: a batch with nothing newer keeps it.
    assert cursor.fold(cursor.seed(expected), rows[0]) == expected
    assert cursor.batches(expected) == [
        Batch('"at" >= %s OR "remaining" <= %s', ("2024-05-01 10:00:00.5+00", 3))
    ]


def test_lookback_reads_behind_the_checkpoint_and_a_limit_bounds_every_batch():
    """The predicate moves back by the lookback along each column's direction (a date by
    whole days, at least the lookback); the checkpoint itself does not. A limit's bound
    narrows every partition, its placeholder after the cursor's."""
    cursor = source(
        cdc_order=["at", "day", "version DESC"], lookback="1 hour 30 minutes"
    ).run_cursor()
    checkpoint = {"at": "2024-05-01 10:00:00.5+00", "day": "2024-05-01", "version": None}
    assert cursor.batches(checkpoint) == [
        Batch(
            '"at" >= %s OR "day" >= %s OR "version" IS NOT NULL',
            ("2024-05-01 08:30:00.500000+00:00", "2024-04-30"),
        )
    ]
    assert cursor.seed(checkpoint) == checkpoint
    numeric = source(cdc_order=["n", "v DESC"], lookback=2.5).run_cursor()
    assert numeric.batches({"n": 10, "v": Decimal("1.25")})[0].params == (
        Decimal("7.5"),
        Decimal("3.75"),
    )
    with pytest.raises(SourceOptionError, match="holds '2024-05-01"):
        numeric.batches({"n": "2024-05-01 10:00:00+00", "v": None})
    with pytest.raises(SourceOptionError, match="holds 10"):
        cursor.batches({"at": 10, "day": None, "version": None})

    limited = source(cdc_order=["at"], limit=100, partitions=["id % 2 = 0", "id % 2 = 1"])
    limit = limited.run_limit()
    assert limit.beyond(None) == Batch('"at" IS NOT NULL')
    assert limit.beyond({"at": 7}) == Batch('"at" > %s', (7,))
    assert limit.within(None, None) is None  # nothing to read but NULLs: no bound
    assert limit.within(None, 9) == Batch('"at" IS NULL OR "at" <= %s', (9,))
    assert limit.within({"at": 7}, None) == Batch('"at" <= %s', (7,))  # nothing past it
    batches = extract.plan(limited, limited.run_cursor(), {"at": 7}, limit.within({"at": 7}, 9))
    assert batches == [
        Batch('(("at" >= %s) AND ("at" <= %s)) AND (id %% 2 = 0)', (7, 9)),
        Batch('(("at" >= %s) AND ("at" <= %s)) AND (id %% 2 = 1)', (7, 9)),
    ]
    downward = source(cdc_order=["v DESC"], limit=1).run_limit()
    assert downward.beyond({"v": 7}) == Batch('"v" < %s', (7,))
    assert downward.within({"v": 7}, 5) == Batch('"v" >= %s', (5,))


@settings(max_examples=30, deadline=None)
@given(order=st.permutations(range(4)), staged=st.booleans())
def test_custom_checkpoint_does_not_depend_on_the_order_batches_complete(
    tmp_path_factory, order, staged
):
    """Four batches read at once, made to complete in every order: one checkpoint."""
    marks = source(strategy="CUSTOM", cursor=Marks)
    checkpoint = {"eu": "2024-05-01", "us": "2024-05-03"}
    batches = extract.plan(marks, marks.cursor, checkpoint)  # eu, us, others
    batches.append(Batch("region = 'eu' AND at >= '2024-05-02'"))
    rows = [
        [{"region": "eu", "at": "2024-05-04"}],
        [{"region": "us", "at": "2024-05-03"}],
        [{"region": "apac", "at": "2024-04-01"}, {"region": "latam", "at": "2024-05-09"}],
        [{"region": "eu", "at": "2024-05-05"}],
    ]
    finished: list[int] = []
    turn = threading.Condition()

    def read_batch(src, table, batch, cursor, cp, sink, page_rows):
        index = batches.index(batch)
        acc = cursor.seed(cp)
        for row in rows[index]:
            acc = cursor.fold(acc, row)
        sink.write([json.dumps(r) for r in rows[index]], [None] * len(rows[index]))
        with turn:  # complete in the drawn order
            turn.wait_for(lambda: order[len(finished)] == index, timeout=10)
            finished.append(index)
            turn.notify_all()
        return acc, len(rows[index])

    options = ExtractionOptions(max_concurrency=4, staging=staged)
    reader = Reader(marks, None, marks.cursor, checkpoint, options, tmp_path_factory.mktemp("s"))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(pgextract, "read_batch", read_batch)
        reads = reader.read_all(batches)
    assert finished == list(order)
    assert extract.advance(marks.cursor, [r.acc for r in reads]) == {
        "eu": "2024-05-05",
        "us": "2024-05-03",
        "apac": "2024-04-01",
        "latam": "2024-05-09",
    }
    assert [r.rows for r in reads] == [1, 1, 2, 1]


def test_checkpoints_are_json_kept_exact_and_refused_under_another_definition(tmp_path):
    watermark = source(cdc_order=["at"])
    store = CheckpointFile(tmp_path)
    assert store.read(watermark, "f", "d") is None
    checkpoint = {"at": "2024-05-01 10:00:00+00", "n": Decimal("12.50"), "k": [1, None]}
    store.write(watermark, checkpoint, rows=3, batches=1)
    assert store.read(watermark, "f", "d") == checkpoint
    assert [p.name for p in tmp_path.iterdir()] == [FILE]  # nothing half-written left
    logged = Extracted(None, rows=3, batches=1, checkpoint=checkpoint, advanced=True)
    assert json.loads(json.dumps(logged.position("src")))["offset"]["n"] == {"$decimal": "12.50"}
    with pytest.raises(CheckpointNotJsonError):
        extract.dumps({"at": datetime(2024, 5, 1)}, "src")
    with pytest.raises(ExtractionChangedError) as refused:
        store.read(source(cdc_order=["version"]), "f", "d")
    assert refused.value.params["stored"]["cdc_order"] == ["at ASC"]
    assert refused.value.params["dataset"] == "d"


# --- against PostgreSQL: the step with an apply that collects ----------------------------


@pytest.fixture(scope="module")
def pg():
    server = Server().start()
    yield server
    server.stop()


def test_stateless_reads_every_row_in_scope_each_run_typed_as_the_table_implies(
    spark, pg, tmp_path
):
    pg.execute(
        "CREATE TABLE kinds (id bigint PRIMARY KEY, n numeric, price numeric(10,2), "
        "at timestamp, at_tz timestamptz, day date, ok boolean, doc jsonb, tags text[], "
        "f double precision, note text);"
        "INSERT INTO kinds VALUES (1, 1.5, 2.25, '2024-05-01 10:00:00.5', "
        "'2024-05-01 12:00:00+02', '2024-05-01', true, '{\"a\": [1]}', '{x,y}', 0.1, 'a%b'),"
        "(2, NULL, NULL, NULL, NULL, '0044-03-15 BC', NULL, NULL, NULL, NULL, NULL),"
        "(1000, 1, 1, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 'out of scope')"
    )
    stateless = source(
        dsn=pg.dsn,
        table="kinds",
        strategy="STATELESS",
        where="id < 1000",
        partitions=["id % 2 = 0", "id % 2 = 1 AND note LIKE 'a%'", "note IS NULL AND id = 1"],
    )
    step = extracting.step(tmp_path, stateless)
    done = step.run(spark, ExtractionOptions(), lambda df, _: (df.dtypes, collect(df)))
    dtypes, rows = done.result
    assert dtypes == [
        ("id", "bigint"),
        ("n", "decimal(38,18)"),
        ("price", "decimal(10,2)"),
        ("at", "timestamp_ntz"),
        ("at_tz", "timestamp"),
        ("day", "date"),
        ("ok", "boolean"),
        ("doc", "string"),
        ("tags", "string"),
        ("f", "double"),
        ("note", "string"),
        ("_corrupt_record", "string"),
    ]
    (first,) = [r for r in rows if r[0] == 1]
    assert first[1:4] == (Decimal("1.5"), Decimal("2.25"), datetime(2024, 5, 1, 10, 0, 0, 500000))
    assert first[5:11] == (datetime(2024, 5, 1).date(), True, '{"a":[1]}', "{x,y}", 0.1, "a%b")
    (bc,) = [r for r in rows if r[-1] is not None]  # out of Spark's range: quarantined
    assert json.loads(bc[-1])["row"]["day"] == "0044-03-15 BC" and bc[0] is None
    assert (done.rows, done.batches, done.checkpoint, done.advanced) == (2, 3, None, False)

    pg.execute("INSERT INTO kinds (id, note) VALUES (3, 'a'); DELETE FROM kinds WHERE id = 1")
    again = step.run(spark, ExtractionOptions(), collect)
    assert sorted(r[0] for r in again.result if r[0] is not None) == [3]
    assert again.rows == 2  # every row in scope, every run
    assert not (step.checkpoints / FILE).exists()


def test_a_limit_reads_a_backfill_in_bounded_runs_and_skips_no_tied_row(spark, pg, tmp_path):
    """``limit=4``: each run reads up to four rows past its checkpoint and every row tied
    at the edge it stops at (seven rows share ``at = 20``), then the next run reads those
    again with the rows past them. The first run also reads the row with no ``at``; a run
    with nothing past its checkpoint reads the rows tied at it."""
    pg.execute(
        "CREATE TABLE backfill (id bigint PRIMARY KEY, at bigint);"
        "INSERT INTO backfill SELECT g, CASE WHEN g <= 5 THEN 10 WHEN g <= 12 THEN 20 "
        "ELSE 30 END FROM generate_series(1, 15) g;"
        "INSERT INTO backfill VALUES (16, NULL)"
    )
    step = extracting.step(
        tmp_path, source(dsn=pg.dsn, table="backfill", cdc_order=["at"], limit=4)
    )

    def once() -> tuple[list[int], int]:
        done = step.run(spark, ExtractionOptions(), collect)
        return sorted(r[0] for r in done.result), done.checkpoint["at"]

    assert once() == ([1, 2, 3, 4, 5, 16], 10)  # the edge: the 4th value, 10, all its ties
    noted = CheckpointFile(step.checkpoints).last_run()  # status's lag: 20 left to read
    assert {k: noted[k] for k in ("rows", "newest", "behind")} == {
        "rows": 6,
        "newest": {"at": 30},
        "behind": {"at": 20.0},
    }
    assert once() == (list(range(1, 13)), 20)  # ties at 10 again, and all seven at 20
    pg.execute("INSERT INTO backfill VALUES (17, 20), (18, 40), (19, 5)")
    assert once() == ([*range(6, 16), 17, 18], 40)  # 30, 30, 30, 40; 17 tied at 20
    assert once() == ([18], 40)  # nothing past 40: its ties only
    assert CheckpointFile(step.checkpoints).last_run()["behind"] == {"at": 0.0}
    # 19, written below the checkpoint after it moved past, is never read (lookback is
    # what reads behind the checkpoint).


LATE_COMMIT = """
CREATE EXTRACTION SOURCE trusting_src FROM late_items
  CONNECTION ENV 'LATE_DSN' ORDER BY updated_at;
CREATE EXTRACTION SOURCE looking_back_src FROM late_items
  CONNECTION 'DSN' ORDER BY updated_at LOOKBACK '30 seconds';
CREATE STREAMING TABLE trusting;
AUTO CDC INTO trusting FROM trusting_src KEYS (id) SEQUENCE BY updated_at;
CREATE STREAMING TABLE looking_back;
AUTO CDC INTO looking_back FROM looking_back_src KEYS (id) SEQUENCE BY updated_at;
"""


def test_lookback_reads_a_row_committed_after_a_later_one_was_read(
    spark, pg, tmp_path, new_table, monkeypatch
):
    """A writer's transaction stamps row 2 at 08:00:05 and commits only after row 3,
    stamped 08:00:10, was read: the checkpoint is already 08:00:10. Without lookback the
    row is never read; with ``LOOKBACK '30 seconds'`` the next run reads it, and the
    target equals the table. The sources are declared in SQL."""
    pg.execute(
        "CREATE TABLE late_items (id bigint PRIMARY KEY, name text, updated_at timestamptz);"
        "INSERT INTO late_items VALUES (1, 'early', '2026-12-01 08:00:00+00')"
    )
    database = new_table("late_commit")
    monkeypatch.setenv("LATE_DSN", pg.dsn)  # declared in SQL, one by name, one by value
    spec = write_project(
        tmp_path, database, {"flow.sql": LATE_COMMIT.replace("'DSN'", repr(pg.dsn))}
    )
    with psycopg.connect(pg.dsn) as writer:
        writer.execute("INSERT INTO late_items VALUES (2, 'late', '2026-12-01 08:00:05+00')")
        pg.execute("INSERT INTO late_items VALUES (3, 'on time', '2026-12-01 08:00:10+00')")
        run(spark, spec)
        writer.commit()
    run(spark, spec)
    held = sorted(pg.query("SELECT id, name FROM late_items"))
    assert len(held) == 3

    def rows(target: str) -> list[tuple]:
        return sorted(
            tuple(r) for r in spark.table(f"{database}.{target}").select("id", "name").collect()
        )

    assert rows("looking_back") == held
    assert rows("trusting") == [r for r in held if r[0] != 2]  # missed for good
    # Status: each flow's last run, caught up with the newest value its source held.
    flows = overview.status(project.load(spec))["flows"]
    lags = {f["target"].split(".")[-1]: f["extraction"] for f in flows}
    for lag in lags.values():
        assert lag["checkpoint"] == lag["newest"] == {"updated_at": "2026-12-01 08:00:10+00"}
        assert lag["behind"] == {"updated_at": 0.0} and 0 <= lag["seconds_since"] < 600
    assert (lags["looking_back"]["rows"], lags["trusting"]["rows"]) == (3, 1)
    assert overview.describe_extraction(lags["trusting"]).startswith("last run ")


def test_a_failed_batch_is_retried_and_when_every_retry_fails_the_checkpoint_stays(
    spark, pg, tmp_path, monkeypatch
):
    """Two cdc_order columns, one descending; ties at the checkpoint read again; a batch
    that fails mid-read (rows already in its staged file) and then succeeds; a run whose
    batch never succeeds applies nothing and keeps the checkpoint, and the next run
    resumes from it."""
    pg.execute(
        "CREATE TABLE jobs (id int PRIMARY KEY, at timestamptz, remaining int);"
        "INSERT INTO jobs VALUES (1, '2024-05-01 10:00+00', 9), (2, '2024-05-01 11:00+00', 5),"
        "(3, '2024-05-01 11:00+00', 7), (4, '2024-05-01 09:00+00', 8)"
    )
    jobs = source(
        dsn=pg.dsn,
        table="jobs",
        cdc_order=["at", "remaining DESC"],
        partitions=["id <= 2", "id > 2"],
    )
    step = extracting.step(tmp_path, jobs)
    options = ExtractionOptions(retries=0, staging=True, page_rows=1, max_concurrency=2)
    first = step.run(spark, options, collect)
    assert [r[0] for r in first.result] == [1, 2, 3, 4]
    assert first.checkpoint == {"at": "2024-05-01 11:00:00+00", "remaining": 5}
    stored = (step.checkpoints / FILE).read_text()

    # A tie at the checkpoint's time, a row whose remaining fell below the least seen, and
    # rows that advanced in neither.
    pg.execute(
        "INSERT INTO jobs VALUES (5, '2024-05-01 11:00+00', 9), (6, '2024-05-01 08:00+00', 6);"
        "UPDATE jobs SET remaining = 4 WHERE id = 4"
    )
    real = pgextract.read_batch
    failures: list[str] = []

    class Breaks:
        """A sink that takes the first page, then loses the connection."""

        def __init__(self, sink):
            self.sink = sink

        def write(self, data, corrupt):
            self.sink.write(data, corrupt)
            raise psycopg.OperationalError("server closed the connection unexpectedly")

    def flaky(src, table, batch, cursor, cp, sink, page_rows, *, times: int):
        if "id > 2" in batch.where and len(failures) < times:
            failures.append(batch.where)
            sink = Breaks(sink)
        return real(src, table, batch, cursor, cp, sink, page_rows)

    def failing(times: int):
        return lambda *args: flaky(*args, times=times)

    monkeypatch.setattr(pgextract, "read_batch", failing(1))
    second = step.run(spark, options, collect)
    assert len(failures) == 1
    # Ties (2, 3 at 11:00; 5) read again, 4 for its remaining; each row once.
    assert [r[0] for r in second.result] == [2, 3, 4, 5]
    assert second.checkpoint == {"at": "2024-05-01 11:00:00+00", "remaining": 4}
    assert not (step.checkpoints / STAGING).exists()  # swept
    stored = (step.checkpoints / FILE).read_text()

    pg.execute("UPDATE jobs SET at = '2024-05-01 12:00+00' WHERE id = 6")
    failures.clear()
    monkeypatch.setattr(pgextract, "read_batch", failing(99))
    applied = []
    with pytest.raises(BatchFailedError) as failed:
        step.run(spark, options, lambda df, _: applied.append(df))
    assert failed.value.params["attempts"] == 2  # retries=0 is clamped to 1
    assert failed.value.params["batch"] == 2 and failed.value.params["batches"] == 2
    assert len(failures) == 2 and applied == []
    assert (step.checkpoints / FILE).read_text() == stored
    assert not (step.checkpoints / STAGING).exists()

    monkeypatch.setattr(pgextract, "read_batch", real)
    resumed = step.run(spark, options, collect)
    assert [r[0] for r in resumed.result] == [2, 3, 4, 5, 6]
    assert resumed.checkpoint == {"at": "2024-05-01 12:00:00+00", "remaining": 4}
    # Nothing new: every row read is a tie, and the checkpoint is kept as it was.
    stored = (step.checkpoints / FILE).read_text()
    quiet = step.run(spark, options, collect)
    assert (quiet.rows, quiet.advanced) == (2, False)  # 6 (a tie) and 4 (remaining)
    assert (step.checkpoints / FILE).read_text() == stored


@contextlib.contextmanager
def locked(pg: Server, table: str) -> Iterator[None]:
    """``table`` locked by another session, as a busy database's writer holds it."""
    with psycopg.connect(pg.dsn) as conn:
        conn.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
        yield
        conn.rollback()


def test_timed_out_queries_are_retried_and_a_lag_lookup_that_keeps_failing_only_loses_the_lag(
    spark, pg, tmp_path, monkeypatch
):
    """issue 64, through libpq: the source's role has a ``statement_timeout`` and each
    kind of query (the newest values, a limit's edge, a batch) is canceled by it once: each
    is sent again and the run reads as if none had been. A lag lookup canceled on every
    attempt leaves the run's lag unknown (status's record, the event log's position) and
    the run goes on; an edge canceled on every attempt fails the run with
    AUTOCDC_EXTRACT_PLAN_FAILED in the database's words, and the checkpoint stays. What
    the runs read, upserted by key, equals the table once they caught up."""
    pg.execute(
        "CREATE TABLE busy (id int PRIMARY KEY, at int, deleted boolean DEFAULT false);"
        "INSERT INTO busy (id, at) SELECT g, 10 * ((g + 1) / 2) FROM generate_series(1, 6) g"
    )
    dsn = f"{pg.dsn} options='-c statement_timeout=100'"
    said: list[str] = []
    busy = source(dsn=dsn, table="busy", cdc_order=["at"], limit=3)
    step = extracting.step(tmp_path, busy, say=said.append)
    timeouts = extracting.Timeouts(monkeypatch, pgextract, lambda: locked(pg, "busy"))
    mirror: dict[int, tuple] = {}

    def run() -> Extracted:
        done = step.run(spark, ExtractionOptions(retries=1), collect)
        mirror.update({r[0]: r[:3] for r in done.result})
        return done

    def table() -> dict[int, tuple]:
        return {r[0]: r for r in pg.query("SELECT id, at, deleted FROM busy")}

    timeouts.inject(newest=1, edge=1, read_batch=1)
    first = run()
    assert timeouts.seen == ["newest", "edge", "read_batch"]
    retried = [s for s in said if "statement timeout); trying again (2 of 2)" in s]
    assert len(retried) == 3 and "QueryCanceled: canceling statement" in retried[0]
    assert (sorted(mirror), first.checkpoint, first.lag_unknown) == ([1, 2, 3, 4], {"at": 20}, None)
    assert CheckpointFile(step.checkpoints).last_run()["behind"] == {"at": 10.0}

    timeouts.inject(newest=2)  # every attempt: the lag is unknown, the run goes on
    second = run()
    assert second.checkpoint == {"at": 30} and mirror == table()
    assert "canceling statement due to statement timeout" in second.lag_unknown
    noted = CheckpointFile(step.checkpoints).last_run()
    assert (noted["newest"], noted["behind"], noted["lag_unknown"]) == (
        None,
        None,
        second.lag_unknown,
    )
    assert second.position("src")["lag_unknown"] == second.lag_unknown
    lag = {**noted, "seconds_since": 1.0}
    assert overview.describe_extraction(lag) == "last run 1 s ago; lag unknown"
    assert said[-1].endswith(f"; lag unknown (the newest values could not be looked up: "
                             f"{second.lag_unknown})")  # fmt: skip

    pg.execute("UPDATE busy SET at = 40, deleted = true WHERE id = 2")  # a soft delete
    stored = (step.checkpoints / FILE).read_bytes()
    timeouts.inject(edge=2)  # every attempt: the run cannot know its batches
    with pytest.raises(PlanFailedError) as failed:
        run()
    assert isinstance(failed.value, BatchFailedError)
    assert failed.value.error_class == "AUTOCDC_EXTRACT_PLAN_FAILED"
    assert failed.value.params["attempts"] == 2 and failed.value.params["where"] == '"at" > %s'
    assert "canceling statement due to statement timeout" in failed.value.params["error"]
    assert (step.checkpoints / FILE).read_bytes() == stored

    last = run()  # nothing injected: the ties at 30 again, and the deleted row
    assert (last.checkpoint, mirror[2]) == ({"at": 40}, (2, 40, True)) and mirror == table()
    assert CheckpointFile(step.checkpoints).last_run()["behind"] == {"at": 0.0}


def test_a_second_run_of_a_source_is_refused_and_a_dead_runs_lease_is_taken_over(
    spark, pg, tmp_path
):
    pg.execute("CREATE TABLE leased (id int PRIMARY KEY); INSERT INTO leased VALUES (1)")
    step = extracting.step(tmp_path, source(dsn=pg.dsn, table="leased", strategy="STATELESS"))
    holder = start_holder(tmp_path / "storage" / LEASES, expiry=60, name="src.lock")
    try:
        with pytest.raises(SourceLockedError) as refused:
            step.run(spark, ExtractionOptions(), collect)
        assert refused.value.params["source"] == "src"
        assert refused.value.params["pid"] == holder.pid
    finally:
        holder.kill()
        holder.wait()
    assert step.run(spark, ExtractionOptions(), collect).result == [(1, None)]
    assert not (tmp_path / "storage" / LEASES / "src.lock").exists()


BAD_CUSTOM = """
from autocdc import pipelines as dp

class Cursor:
    def batches(self, checkpoint):
        return [dp.ExtractionBatch()]

    def seed(self, checkpoint):
        return {{}}

dp.create_extraction_source(
    name="src", dsn="host=nowhere", table="t", strategy="CUSTOM", cursor=Cursor
)
"""
OPTIONS_ELSEWHERE = """
from autocdc import pipelines as dp

@dp.temporary_view
def changes():
    return spark.readStream.schema("{feed}").json("{data}")

dp.create_streaming_table("t")
dp.create_auto_cdc_flow(target="t", source="changes", keys=["id"], sequence_by="seq",
                        extract_options=dp.ExtractionOptions(retries=2))
"""


@pytest.mark.parametrize(
    ("files", "error"),
    [
        ({"src.py": BAD_CUSTOM}, CursorHookMissingError),
        ({"flow.py": OPTIONS_ELSEWHERE}, PipelineDefinitionError),
    ],
)
def test_pipeline_definitions_refused_before_anything_runs(
    spark, tmp_path, new_table, files, error
):
    database = new_table("extract")
    spec = write_project(tmp_path, database, files)
    with pytest.raises(error) as refused:
        run(spark, spec)
    if error is CursorHookMissingError:
        assert refused.value.params["missing"] == ["fold", "merge"]
    assert not (tmp_path / "storage").exists()


SNAPSHOT_OVER_EXTRACTION = """
from autocdc import pipelines as dp

dp.create_extraction_source(name="items_src", dsn="{dsn}", table="{table}",
                            strategy="{strategy}"{order})
dp.create_streaming_table("items")
# The tests' last run deletes 2 of 3 rows: real deletes, past the default guard.
dp.create_auto_cdc_from_snapshot_flow(target="items", source="items_src", keys=["id"],
                                      stored_as_scd_type={scd}, max_delete_fraction=None)
"""


def _snapshot_project(tmp_path, database, pg, table, scd=1, strategy="STATELESS", order=""):
    text = SNAPSHOT_OVER_EXTRACTION.replace("{dsn}", pg.dsn).replace("{table}", table)
    text = text.replace("{strategy}", strategy).replace("{order}", order)
    return write_project(tmp_path, database, {"flow.py": text.replace("{scd}", str(scd))})


@pytest.mark.parametrize("scd", [1, 2])
def test_a_snapshot_flow_over_a_stateless_source_mirrors_deletes(
    spark, pg, tmp_path, new_table, scd
):
    """Each run reads the table whole as the next snapshot (version: the run's number):
    rows deleted between runs leave the target (SCD2: their version ends), an unchanged
    row keeps its version, a changed one gets a new one."""
    table = f"snap_items_{scd}"
    pg.execute(
        f"CREATE TABLE {table} (id bigint PRIMARY KEY, name text);"
        f"INSERT INTO {table} VALUES (1, 'a'), (2, 'b'), (3, 'c')"
    )
    database = new_table(f"snap_extract_{scd}")
    spec = _snapshot_project(tmp_path, database, pg, table, scd)
    traffic = [
        "",
        f"DELETE FROM {table} WHERE id = 2; UPDATE {table} SET name = 'c2' WHERE id = 3;"
        f"INSERT INTO {table} VALUES (4, 'd')",
        f"DELETE FROM {table} WHERE id IN (1, 4)",
    ]
    for sql in traffic:
        if sql:
            pg.execute(sql)
        run(spark, spec)
        live = sorted(pg.query(f"SELECT id, name FROM {table}"))
        rows = spark.table(f"{database}.items")
        if scd == 2:
            rows = rows.where("__END_AT IS NULL")
        assert sorted((r.id, r.name) for r in rows.collect()) == live
    assert live == [(3, "c2")]
    (lag,) = [f["extraction"] for f in overview.status(project.load(spec))["flows"]]
    assert (lag["rows"], lag["checkpoint"], lag["behind"]) == (1, None, {})  # a time only
    if scd == 2:
        versions = spark.table(f"{database}.items").orderBy("id", "__START_AT")
        assert [tuple(r) for r in versions.collect()] == [
            (1, "a", 1, 3),
            (2, "b", 1, 2),
            (3, "c", 1, 2),
            (3, "c2", 2, None),
            (4, "d", 2, 3),
        ]


def test_a_snapshot_flow_over_a_watermark_source_is_refused(spark, pg, tmp_path, new_table):
    pg.execute("CREATE TABLE snap_marked (id bigint PRIMARY KEY, at bigint)")
    database = new_table("snap_marked")
    order = ', cdc_order=["at"]'
    spec = _snapshot_project(
        tmp_path, database, pg, "snap_marked", strategy="WATERMARK", order=order
    )
    with pytest.raises(PipelineDefinitionError, match="would delete every other key") as refused:
        run(spark, spec)
    assert "strategy='STATELESS'" in str(refused.value)
    assert not (tmp_path / "storage").exists()


TIED_READS = """
from autocdc import pipelines as dp

dp.create_extraction_source(name="items_src", dsn="DSN", table="tied_items",
                            cdc_order=["updated_at"])
for scd in (1, 2):
    for seq in ("updated_at", None):
        target = "items_" + str(scd) + ("_seq" if seq else "_read")
        dp.create_streaming_table(target)
        dp.create_auto_cdc_flow(target=target, source="items_src", keys=["id"],
                                sequence_by=seq, stored_as_scd_type=scd,
                                apply_as_deletes="deleted", except_column_list=["deleted"])
"""


def test_a_row_read_again_at_an_equal_sequence_ends_as_the_table_holds_it(
    spark, pg, tmp_path, new_table
):
    """A coarse clock: row 111 changes twice in one tick of ``updated_at``. The second run
    reads it again (the predicate is ``>=``), and the later read wins over the greater row,
    whether the flow declares ``sequence_by`` or is sequenced by the read alone; a third
    run, which reads the tied row once more unchanged, adds no version."""
    pg.execute(
        "CREATE TABLE tied_items (id bigint PRIMARY KEY, name text, qty int, "
        "price numeric(10,2), updated_at timestamptz, deleted boolean);"
        "INSERT INTO tied_items VALUES "
        "(111, 'lamp', 3, 84.06, '2026-12-01 08:00:00+00', false),"
        "(112, 'desk', 1, 120.00, '2026-12-01 07:00:00+00', false)"
    )
    database = new_table("tied_reads")
    spec = write_project(tmp_path, database, {"flow.py": TIED_READS.replace("DSN", pg.dsn)})
    targets = [f"items_{scd}_{how}" for scd in (1, 2) for how in ("seq", "read")]
    traffic = [
        "",
        "UPDATE tied_items SET price = price * -1, updated_at = '2026-12-01 08:00:00+00' "
        "WHERE id = 111",
        "",
    ]
    for sql in traffic:
        if sql:
            pg.execute(sql)
        run(spark, spec)
        held = sorted(pg.query("SELECT id, name, qty, price FROM tied_items"))
        for target in targets:
            rows = spark.table(f"{database}.{target}")
            if target.startswith("items_2"):
                rows = rows.where("__END_AT IS NULL")
            got = sorted(tuple(r) for r in rows.select("id", "name", "qty", "price").collect())
            assert got == held, target
    assert dict((r[0], r[3]) for r in held)[111] == Decimal("-84.06")
    for how in ("seq", "read"):
        history = spark.table(f"{database}.items_2_{how}").where("id = 111")
        versions = history.orderBy("__START_AT").select("price", "__START_AT", "__END_AT")
        versions = [tuple(r) for r in versions.collect()]
        assert [v[0] for v in versions] == [Decimal("84.06"), Decimal("-84.06")], how
        (_, first_start, first_end), (_, second_start, second_end) = versions
        assert first_end == second_start and second_end is None
        if how == "seq":  # the flow's own sequence first, then the read's
            assert first_start["updated_at"] == second_start["updated_at"]
            assert first_start["__autocdc_read"] < second_start["__autocdc_read"]
        else:  # the read's time: the first read's before the second's
            assert isinstance(first_start, datetime) and first_start < second_start


def test_a_target_sequenced_before_reads_were_is_refused_until_a_full_refresh(
    spark, pg, tmp_path, new_table
):
    """A target an extraction flow built when only ``sequence_by`` ordered it: its stored
    sequence type is not the flow's now, so the run is refused, naming the full refresh
    that rebuilds it from the table."""
    pg.execute(
        "CREATE TABLE old_items (id bigint PRIMARY KEY, price numeric(10,2), "
        "updated_at timestamptz, deleted boolean);"
        "INSERT INTO old_items VALUES (1, 2.50, '2026-12-01 08:00:00+00', false)"
    )
    database = new_table("old_reads")
    text = TIED_READS.replace("DSN", pg.dsn).replace("tied_items", "old_items")
    text = text.replace("for scd in (1, 2):", "for scd in (1,):")
    text = text.replace('for seq in ("updated_at", None):', 'for seq in ("updated_at",):')
    spec = write_project(tmp_path, database, {"flow.py": text})
    before = spark.createDataFrame(
        [(1, Decimal("2.50"), datetime(2026, 12, 1, 8), False)],
        "id bigint, price decimal(10,2), updated_at timestamp, deleted boolean",
    )
    AutoCdcFlow(
        target=f"{database}.items_1_seq",
        keys=["id"],
        sequence_by="updated_at",
        apply_as_deletes="deleted",
        except_column_list=["deleted"],
    ).apply(before)
    with pytest.raises(DefinitionChangedError) as refused:
        run(spark, spec)
    assert "`autocdc run --full-refresh items_1_seq`" in str(refused.value)
    run(spark, spec, full_refresh={"items_1_seq"})
    rows = spark.table(f"{database}.items_1_seq").select("id", "price").collect()
    assert [tuple(r) for r in rows] == [(1, Decimal("2.50"))]
