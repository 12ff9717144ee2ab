"""Operating a pipeline: the event log a run writes, ``autocdc status`` and ``autocdc
history`` (JSON and tables), progress lines and the live table.

One pipeline run of three one-file micro-batches (module fixture) serves the event log,
status and history tests; a failing run and a killed run have their own projects.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pytest
from changes import A, B, C
from deltalake import DeltaTable, write_deltalake
from processes import child_env, finish, start
from projects import drop, run, write_project
from reference import fold_scd1
from rich.console import Console
from sparkconf import SMALL_SPARK

from autocdc import AutoCdcFlow
from autocdc.engine.errors import ConcurrentWriteError
from autocdc.engine.metrics import BatchMetrics
from autocdc.pipelines import cli
from autocdc.pipelines.declare import project, scaffold
from autocdc.pipelines.execute import eventlog
from autocdc.pipelines.execute.position import Lag, lag
from autocdc.pipelines.execute.progress import FlowProgress, Progress, outcome, render
from autocdc.pipelines.operations import overview

FEED = """
from pyspark import pipelines as dp

@dp.temporary_view
def changes():
    return spark.readStream.schema("{feed}").option("maxFilesPerTrigger", 1).json("{data}")

dp.create_streaming_table("latest")
dp.create_auto_cdc_flow(
    target="latest", source="changes", keys=["id"], sequence_by="seq",
    apply_as_deletes="op = 'D'", except_column_list=["op", "seq"],
)
"""
ADDED = ("staged", "applied_staged")  # event log columns added since its first release
NULL_KEY = '{"id": null, "a": "x", "b": 1, "op": "U", "seq": 9}\n'


def events(spark, root: Path) -> list:
    log = spark.read.format("delta").load(str(root / "storage" / "event_log"))
    assert [f.name for f in log.schema] == [f.name for f in eventlog.SCHEMA]
    return log.orderBy("event_time").collect()


@pytest.fixture(scope="module")
def ran(spark, warehouse, tmp_path_factory):
    """Three files, one micro-batch each (one with a NULL key); the metrics ``apply``
    returned are recorded to compare with the log. The project's warehouse is this
    session's, where ``status`` (which reads without Spark) finds the tables."""
    root = tmp_path_factory.mktemp("operated")
    database = f"ops_{os.getpid()}"
    spec = write_project(
        root, database, {"feed.py": FEED}, {"spark.sql.warehouse.dir": str(warehouse)}
    )
    drop(root, "1", A)
    drop(root, "2", B)
    with (root / "data" / "2.json").open("a") as f:
        f.write(NULL_KEY)
    drop(root, "3", C)
    for i in (1, 2, 3):  # Spark's file source reads the oldest first
        os.utime(root / "data" / f"{i}.json", (1_000_000 + i, 1_000_000 + i))
    recorded: list[BatchMetrics] = []
    apply = AutoCdcFlow.apply

    def recording(self, df):
        recorded.append(apply(self, df))
        return recorded[-1]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(AutoCdcFlow, "apply", recording)
        run(spark, spec)
    return root, spec, database, recorded


def test_event_log_records_the_run_and_each_batch(spark, ran):
    root, _spec, database, recorded = ran
    rows = events(spark, root)
    assert [r.event_type for r in rows] == [
        "run_started",
        "flow_started",
        "batch",
        "batch",
        "batch",
        "flow_stopped",
        "run_finished",
    ]
    assert {r.run_id for r in rows} == {rows[0].run_id}
    assert {(r.pipeline, r.pid) for r in rows} == {(database, os.getpid())}
    assert [r.flow for r in rows] == [None, *["latest"] * 5, None]
    batches = [r for r in rows if r.event_type == "batch"]
    assert len(recorded) == 3
    for row, metrics in zip(batches, recorded, strict=True):
        assert json.loads(row.metrics) == metrics.as_dict()
        assert (row.batch_id, row.rows_in, row.upserted, row.deleted, row.quarantined) == (
            metrics.batch_id,
            metrics.rows_in,
            metrics.upserted,
            metrics.deleted,
            metrics.quarantined,
        )
        assert row.target == f"{database}.latest"
    assert [r.stream_batch_id for r in batches] == [0, 1, 2]
    offsets = [json.loads(r.source_position)[0] for r in batches]
    assert [o["offset"] for o in offsets] == [{"logOffset": i} for i in range(3)]
    assert {(o["kind"], o["path"]) for o in offsets} == {("files", str(root / "data"))}
    sizes = [(root / "data" / f"{i}.json").stat().st_size for i in (1, 2, 3)]
    assert (rows[1].lag_files, rows[1].lag_bytes) == (3, sum(sizes))  # flow_started
    assert [(r.lag_files, r.lag_bytes) for r in batches] == [
        (2, sizes[1] + sizes[2]),
        (1, sizes[2]),
        (0, 0),
    ]
    assert batches[-1].lag_seconds is None and batches[0].lag_seconds >= 0


def test_status_and_history_json(spark, ran, monkeypatch, capsys):
    root, spec, database, recorded = ran
    monkeypatch.chdir(root)

    def cli_json(*args: str) -> dict:
        assert cli.main([*args, "--spec", str(spec), "--json"]) == 0
        return json.loads(capsys.readouterr().out)

    status = cli_json("status")
    run_id = events(spark, root)[0].run_id
    assert status["last_run"]["run_id"] == run_id
    assert status["last_run"]["status"] == "finished"
    (flow,) = status["flows"]
    last = recorded[-1]
    assert flow["flow"] == "latest" and flow["target"] == f"{database}.latest"
    assert flow["scd_type"] == 1
    assert flow["last_batch"]["batch_id"] == last.batch_id
    assert flow["last_batch"]["stream_batch_id"] == 2
    assert flow["last_batch"]["rows_applied"] == last.upserted + last.deleted
    assert flow["rows_applied_total"] == sum(m.upserted + m.deleted for m in recorded)
    assert flow["live_rows"] == len(fold_scd1(A + B + C))
    assert flow["quarantined"] == {"total": 1, "by_reason": {"AUTOCDC_NULL_KEY": 1}}
    assert flow["tombstones_live"] == last.tombstones_live
    assert flow["lag"] == {
        "files": 0,
        "bytes": 0,
        "versions": None,
        "records": None,
        "oldest_age_seconds": None,
    }
    assert flow["last_run"]["status"] == "finished"

    drop(root, "4", C[:1])  # not run: status sees it now, from the source folder
    new = root / "data" / "4.json"
    try:
        waiting = cli_json("status")["flows"][0]["lag"]
        assert (waiting["files"], waiting["bytes"]) == (1, new.stat().st_size)
    finally:
        new.unlink()
    assert waiting["oldest_age_seconds"] >= 0

    history = cli_json("history", "latest", "--last", "2")
    assert [b["batch_id"] for b in history["batches"]] == [m.batch_id for m in recorded[-2:]]
    assert [b["metrics"] for b in history["batches"]] == [m.as_dict() for m in recorded[-2:]]
    assert [b["lag"]["files"] for b in history["batches"]] == [1, 0]
    assert history["batches"][0]["quarantined"] == 1

    by_target = cli_json("history", f"{database}.latest", "--last", "2")  # its one flow
    assert (by_target["flow"], by_target["batches"]) == ("latest", history["batches"])

    assert cli.main(["history", "nope", "--spec", str(spec)]) == 2
    assert "AUTOCDC_PIPELINE_UNKNOWN_FLOW" in capsys.readouterr().err


def test_status_and_history_tables(spark, ran, monkeypatch, capsys):
    root, spec, database, recorded = ran
    monkeypatch.chdir(root)
    assert cli.main(["status", "--spec", str(spec)]) == 0
    out = capsys.readouterr().out
    assert "finished" in out
    assert out.splitlines()[2].split()[:3] == ["latest", f"{database}.latest", "1"]
    assert out.splitlines()[3].endswith("AUTOCDC_NULL_KEY 1")
    assert cli.main(["history", "latest", "--spec", str(spec)]) == 0
    out = capsys.readouterr().out
    assert "flow latest" in out
    # Micro-batches by their query's number, then the engine's commit each left.
    assert [line.split()[:2] for line in out.splitlines()[-3:]] == [
        [str(i), str(m.batch_id)] for i, m in enumerate(recorded)
    ]


def test_target_counts_without_spark_are_sparks(spark, warehouse, new_table):
    """``status`` counts an SCD2 target's open versions and its quarantine with delta-rs,
    through the deletion vectors its MERGEs leave: the numbers Spark gives."""
    target = new_table("counted")
    flow = AutoCdcFlow(
        target=target,
        keys=["id"],
        sequence_by="seq",
        apply_as_deletes="op = 'D'",
        except_column_list=["op", "seq"],
        stored_as_scd_type=2,
    )
    schema = "id long, v string, seq long, op string"
    first = [(i, f"v{i}", i, "U") for i in range(6)] + [(None, "x", 9, "U")]
    flow.apply(spark.createDataFrame(first, schema))
    flow.apply(spark.createDataFrame([(1, "w", 10, "U"), (2, None, 11, "D")], schema))
    assert any(p.name.startswith("deletion_vector") for p in (warehouse / target).iterdir())
    table = spark.table(target)
    assert overview.target_counts(warehouse, flow.flow_name, target) == {
        "scd_type": 2,
        "live_rows": table.where("__END_AT IS NULL").count(),
        "quarantined": {"total": 1, "by_reason": {"AUTOCDC_NULL_KEY": 1}},
    }
    assert table.where("__END_AT IS NULL").count() == 5  # six keys, one deleted


def test_failed_run_logs_the_error_class(spark, tmp_path, monkeypatch):
    spec = write_project(tmp_path, f"failing_{os.getpid()}", {"feed.py": FEED})
    drop(tmp_path, "1", A)

    def losing(self, df):
        raise ConcurrentWriteError(table=self.state_table, attempts=8)

    monkeypatch.setattr(AutoCdcFlow, "apply", losing)
    with pytest.raises(ConcurrentWriteError):  # itself, not Spark's exception around it
        run(spark, spec)
    rows = events(spark, tmp_path)
    assert [r.event_type for r in rows] == ["run_started", "flow_started", "error", "run_failed"]
    assert [r.error_class for r in rows[2:]] == ["AUTOCDC_CONCURRENT_WRITE"] * 2
    assert rows[2].flow == "latest" and "state" in rows[3].message
    last_run = overview.status(project.load(spec))["last_run"]
    assert (last_run["status"], last_run["error_class"]) == ("failed", "AUTOCDC_CONCURRENT_WRITE")


@pytest.mark.e2e
def test_killed_run_keeps_its_committed_events(spark, tmp_path):
    """SIGKILL inside the first apply: what was logged before stays, and status reports
    the run as interrupted with every file still to process."""
    config = {**SMALL_SPARK, "spark.sql.warehouse.dir": str(tmp_path / "warehouse")}
    spec = write_project(tmp_path, "killed", {"feed.py": FEED}, config)
    drop(tmp_path, "1", A)
    drop(tmp_path, "2", B)
    assert finish(start(spec, "after_state_commit")) == -signal.SIGKILL
    rows = events(spark, tmp_path)
    assert [r.event_type for r in rows] == ["run_started", "flow_started"]
    status = overview.status(project.load(spec))
    assert status["last_run"]["status"] == "interrupted"
    assert status["flows"][0]["lag"]["files"] == 2


@pytest.mark.e2e
def test_status_into_a_closed_pipe_ends_quietly(tmp_path):
    """``autocdc status --json | head -3``: the reader gone, the command exits 141 (as one
    SIGPIPE ends) with nothing on stderr and no traceback in the log."""
    root = scaffold.create(tmp_path / "shop")
    proc = subprocess.Popen(
        [sys.executable, "-m", "autocdc", "status", "--json"],
        cwd=root,
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    proc.stdout.close()  # before it writes: its first write finds no reader
    _, stderr = proc.communicate(timeout=120)
    assert (proc.returncode, stderr) == (141, "")
    assert not (root / "autocdc-logs").exists()


def test_lag_of_file_and_delta_sources(tmp_path):
    """Driver-side lag: files the checkpoint's file log has not reached, and Delta
    versions beyond the offset (``index -1``: that version not read yet)."""
    data, table, checkpoint = tmp_path / "data", tmp_path / "table", tmp_path / "ck"
    data.mkdir()
    for name in ("1.json", "2.json", "_hidden", ".crc"):
        (data / name).write_text("{}\n")
    (checkpoint / "sources" / "0").mkdir(parents=True)
    (checkpoint / "sources" / "0" / "0").write_text(
        'v1\n{"path":"file://' + str(data / "1.json") + '","timestamp":1,"batchId":0}\n'
    )
    (table / "_delta_log").mkdir(parents=True)
    for version in range(4):
        (table / "_delta_log" / f"{version:020d}.json").write_text("{}")
    found = [{"kind": "files", "path": str(data)}, {"kind": "delta", "path": str(table)}]
    ends = [{"logOffset": 0}, {"reservoirVersion": 2, "index": -1}]
    got = lag(found, ends, checkpoint)
    assert (got.files, got.bytes, got.versions) == (1, 3, 2)
    assert got.oldest_age_seconds is not None and got.oldest_age_seconds >= 0
    ends = [{"logOffset": -1}, {"reservoirVersion": 3, "index": 5}]
    assert (lag(found, ends, checkpoint).files, lag(found, ends, checkpoint).versions) == (2, 0)
    assert lag([{"kind": "other", "path": None}], [None], checkpoint) == Lag()


def test_batch_outcome_in_words():
    """A batch's line says where every row read went: 5 read, 2 applied, 1 stale, 1
    quarantined, so 1 merged within the batch (a later change of its key won)."""
    metrics = BatchMetrics(
        *("orders", 3, 5, 0, 2, 0, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0.5), steps={"merge": 0.2}
    )
    assert outcome(metrics.as_dict()) == (
        "read 5 rows: 2 applied (2 upserted, 0 deleted), 1 merged within the batch, "
        "1 stale, 1 quarantined"
    )
    # max_staleness: 3 read, 1 quarantined, 2 staged (not dropped), 5 held now.
    staged = replace(metrics, upserted=0, ignored_stale=0, stage_id=4, rows_staged=2, staged_rows=5)
    staged = replace(staged, staged_batches=2, oldest_staged_seconds=44.6, rows_in=3)
    assert outcome(staged.as_dict()) == (
        "read 3 rows: 2 staged, 1 quarantined; 5 staged in 2 micro-batches, the oldest 45 s old"
    )
    # The same micro-batch made the staged rows due: 7 applied, 1 beyond the horizon.
    due = replace(staged, applied_staged=7, upserted=3, deleted=1, ignored_stale=1)
    due = replace(due, quarantined=2, staged_rows=0, staged_batches=0)
    assert outcome(due.as_dict()) == (
        "read 3 rows: 2 staged, 1 quarantined; applied 7 staged rows: 4 applied (3 upserted, "
        "1 deleted), 1 merged within the batch, 1 stale, 1 quarantined; nothing staged"
    )


def test_progress_lines_and_live_table(capsys):
    plain = Progress(live=False)
    with plain:
        plain.started("orders", Lag(files=3, bytes=300))
        plain.batch("orders", 7, rows=1200, seconds=2.0, lag=Lag(files=2, bytes=200))
        plain.staged_applied("orders", 900, seconds=1.0, lag=Lag(files=0, bytes=0))
        plain.stopped("orders", Lag(files=0, bytes=0))
    assert capsys.readouterr().out == (
        "autocdc: flow orders: micro-batch 7; this run 1 micro-batch, 1,200 rows, 600 rows/s; "
        "lag 2 files (200 bytes)\n"
        # An apply of staged rows: no micro-batch, and its rows were counted staged.
        "autocdc: flow orders: applied 900 staged rows; this run 1 micro-batch, 1,200 rows, "
        "400 rows/s; lag 0 files (0 bytes)\n"
    )

    screen = io.StringIO()
    console = Console(file=screen, force_terminal=True, width=120)
    with Progress(live=True, console=console) as live:
        live.batch("orders", 7, rows=1200, seconds=2.0, lag=Lag(versions=4))
    assert capsys.readouterr().out == ""
    assert "orders" in screen.getvalue()

    table = Console(file=io.StringIO(), width=120, record=True)
    table.print(
        render(
            [
                FlowProgress("orders", 2, 8, 900, 3.0, Lag(versions=1)),
                FlowProgress("x"),
                FlowProgress("y", 1, 1, 5, 50.0),
            ]
        )
    )
    assert [line.split() for line in table.export_text().splitlines()] == [
        ["flow", "state", "micro-batch", "rows", "rows/s", "lag"],
        ["orders", "running", "8", "900", "300", "1", "versions"],
        ["x", "running", "-", "0", "-", "-"],
        ["y", "running", "1", "5", "0.1", "-"],
    ]


DELTA_FEED = """
from autocdc import pipelines as dp

@dp.temporary_view
def changes():
    return spark.readStream.table("{db}.source")

dp.create_streaming_table("mirror")
dp.create_auto_cdc_flow(target="mirror", source="changes", keys=["id"], sequence_by="seq")
"""


def test_delta_source_position_and_versions_behind(spark, tmp_path):
    """A Delta table source: the batch reached its latest version (lag 0 versions); a
    new commit to the source shows as one version behind in status, without running."""
    database = f"delta_src_{os.getpid()}"
    source = f"{database}.source"
    spark.sql(f"CREATE DATABASE IF NOT EXISTS {database}")
    spark.sql(
        f"CREATE TABLE {source} (id INT, seq BIGINT) USING delta LOCATION '{tmp_path / 'src'}'"
    )
    spark.sql(f"INSERT INTO {source} VALUES (1, 1), (2, 1)")
    spec = write_project(tmp_path / "project", database, {"mirror.py": DELTA_FEED})
    run(spark, spec)
    (batch,) = [r for r in events(spark, tmp_path / "project") if r.event_type == "batch"]
    (reached,) = json.loads(batch.source_position)
    assert (reached["kind"], reached["path"]) == ("delta", str(tmp_path / "src"))
    assert reached["offset"]["reservoirVersion"] == 2  # versions 0 and 1 read
    assert (batch.lag_files, batch.lag_seconds) == (None, None)
    loaded = project.load(spec)
    assert overview.status(loaded)["flows"][0]["lag"]["versions"] == 0
    spark.sql(f"INSERT INTO {source} VALUES (3, 1)")
    behind = overview.status(loaded)["flows"][0]["lag"]
    assert behind["versions"] == 1 and behind["files"] is None
    assert behind["oldest_age_seconds"] >= 0


def test_an_older_event_log_gains_the_columns_added_since(tmp_path):
    """A log an older autocdc wrote (without ``staged`` and ``applied_staged``) takes the
    next run's events: the columns are added, its old rows read NULL there."""
    location = tmp_path / "event_log"
    older = pa.schema([f for f in eventlog.ARROW_SCHEMA if f.name not in ADDED])
    log = eventlog.EventLog(location, "shop")
    first = {k: v for k, v in log.row("run_started", *[None] * 7).items() if k not in ADDED}
    write_deltalake(str(location), pa.Table.from_pylist([first], schema=older), mode="append")
    log.write("run_stopped", message="interrupted by the user")
    table = DeltaTable(str(location))
    assert [f.name for f in table.schema().fields] == [f.name for f in eventlog.SCHEMA]
    rows = sorted(table.to_pyarrow_table().to_pylist(), key=lambda r: r["event_time"])
    assert [(r["event_type"], r["staged"], r["message"]) for r in rows] == [
        ("run_started", None, None),
        ("run_stopped", None, "interrupted by the user"),
    ]


def test_status_lines_for_staged_changes_and_retries():
    """The table view's lines under the table: a flow holding staged changes, a flow
    started again after failures; nothing for a flow with nothing staged."""
    run = {"run_id": "r1", "status": "finished", "started": "2026-12-07T19:00:00Z"}
    run |= {"ended": "2026-12-07T19:01:00Z", "error_class": None, "message": None}
    lag = {"files": None, "bytes": None, "versions": 0, "records": None}
    lag |= {"oldest_age_seconds": None}
    flow = {
        "flow": "latest",
        "target": "db.latest",
        "scd_type": 1,
        "last_batch": None,
        "rows_applied_total": 0,
        "live_rows": 3,
        "quarantined": {"total": 0, "by_reason": {}},
        "tombstones_live": 0,
        "lag": lag,
        "extraction": None,
        "load_by_watermarks": {},
        "staged": {"batches": 2, "rows": 5, "oldest_age_seconds": 45.0, "last_apply_rows": 0},
        "retries": {
            "count": 2,
            "last_error_class": "InjectedFault",
            "last_message": "attempt 2 of 2 in 10 s: injected fault\nmore",
            "last_time": "2026-12-07T19:00:30Z",
        },
    }
    idle = {**flow, "flow": "history_cdc", "retries": None}
    idle["staged"] = {**flow["staged"], "rows": 0, "batches": 0}
    out = io.StringIO()
    doc = {"pipeline": "p", "event_log": "/log", "last_run": run, "flows": [flow, idle]}
    overview.show_status(doc, Console(file=out, width=200))
    lines = out.getvalue().splitlines()
    assert (
        "latest: 5 changes staged in 2 micro-batches, the oldest 45 s old (applied within "
        "max_staleness; `autocdc apply` applies them now)" in lines
    )
    assert (
        "latest: started again 2 times in its last run after failures, the last at "
        "2026-12-07 19:00:30 UTC (attempt 2 of 2 in 10 s: injected fault)" in lines
    )
    assert not any(line.startswith("history_cdc:") for line in lines)
