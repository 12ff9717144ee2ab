"""Exactly once: ``autocdc run`` killed with SIGKILL inside an apply and at a random
moment, rerun with new files in between, then run to the end. Every target equals the
reference fold of all files: nothing lost, nothing doubled."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from changes import EVERYTHING
from deltalake import DeltaTable
from processes import alive, child_env, children, finish, start
from projects import PYSPARK_SCD1, RAW, SQL_SCD2, drop, write_project
from pyspark.errors import AnalysisException
from reference import fold_scd1, fold_scd2
from sparkconf import SMALL_SPARK

from autocdc.engine.faults import FAIL_ENV
from autocdc.pipelines import cli
from autocdc.pipelines.execute.runner import STOPPED

SEED = int(os.environ.get("AUTOCDC_CRASH_SEED", "7"))


@pytest.mark.e2e
def test_killed_runs_converge_exactly_once(spark, tmp_path):
    rng = random.Random(SEED)
    changes = rng.sample(EVERYTHING, len(EVERYTHING))
    files = [changes[:5], changes[5:10], changes[10:]]
    config = {**SMALL_SPARK, "spark.sql.warehouse.dir": str(tmp_path / "warehouse")}
    spec = write_project(
        tmp_path, "killed", {"feed.py": PYSPARK_SCD1, "history.sql": SQL_SCD2}, config
    )

    drop(tmp_path, "1", files[0])
    drop(tmp_path, "2", files[1])
    story = [finish(start(spec, "after_state_commit"))]  # inside the first apply
    story.append(finish(start(spec, None), kill_after=rng.uniform(15, 30)))
    drop(tmp_path, "3", files[2])
    story.append(finish(start(spec, "after_target_commit")))
    assert story[0] == story[2] == -signal.SIGKILL, story
    started = time.monotonic()
    assert finish(start(spec, None)) == 0

    tables = tmp_path / "warehouse" / "killed.db"
    latest = spark.read.format("delta").load(str(tables / "latest")).collect()
    assert {r.id: (r.a, r.b) for r in latest} == fold_scd1(EVERYTHING), (SEED, story)
    history = spark.read.format("delta").load(str(tables / "history")).collect()
    got = {(r.id, (r.a, r.b), r["__START_AT"], r["__END_AT"]) for r in history}
    assert got == fold_scd2(EVERYTHING), (SEED, story, time.monotonic() - started)


# The feed of PYSPARK_SCD1 through a Python UDF that touches "applying" in the project
# folder and dawdles: a marker that the first apply's jobs are running, for long enough.
SLOW_SCD1 = PYSPARK_SCD1.replace(
    'return spark.readStream.schema("{feed}").json("{data}")',
    """import pathlib, time
    from pyspark.sql import functions as F

    @F.udf("bigint")
    def applying(seq):
        pathlib.Path("{data}/../applying").touch()
        time.sleep(0.3)
        return seq

    return spark.readStream.schema("{feed}").json("{data}").withColumn("seq", applying("seq"))""",
)
INTERRUPTED = [
    "autocdc: interrupted (Ctrl-C): every committed batch is kept; the next run goes on from there"
]


def _interrupted_when(
    tmp_path, name: str, marker: str, later: float = 0.0
) -> tuple[int, list[str], float, Path]:
    """``autocdc run --continuous`` of a new project, sent SIGINT ``later`` seconds after
    ``marker`` (a path in its folder) exists: its exit code, the lines it printed after,
    how many seconds it took to exit, and its spec. Once its JVM is up (its process a
    child of the command's as the signal is sent), it is gone when the command exits."""
    root = tmp_path / name
    config = {**SMALL_SPARK, "spark.sql.warehouse.dir": str(root / "warehouse")}
    spec = write_project(root, "stopped", {"feed.py": SLOW_SCD1}, config)
    drop(root, "1", EVERYTHING)
    proc = subprocess.Popen(
        [sys.executable, "-m", "autocdc", "run", "--continuous", "--spec", str(spec)],
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 300
    while not (root / marker).exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(later)
    jvm = children(proc.pid)
    proc.send_signal(signal.SIGINT)
    sent = time.monotonic()
    output, _ = proc.communicate(timeout=300)
    assert not (root / "storage" / "autocdc-run.lock").exists()
    if (root / "storage" / "event_log").is_dir():  # the run began: its JVM was up
        assert jvm and [pid for pid in jvm if alive(pid)] == [], (jvm, output[-2000:])
    said = [line for line in output.splitlines() if not line.startswith("autocdc: pipeline ")]
    said = [line for line in said if not line.startswith("autocdc: running continuously")]
    return proc.returncode, said, time.monotonic() - sent, spec


@pytest.mark.e2e
def test_ctrl_c_at_any_moment_prints_one_line_exits_130_and_releases_the_lock(tmp_path, capsys):
    """SIGINT (Ctrl-C) as the JVM starts (pyspark's own handler must not answer it, nor
    must the run wait for the JVM) and in the middle of the first apply of a continuous
    run: exit 130, one line saying so (no py4j tracebacks), the lock released, no JVM
    left behind; the run is recorded as stopped by the user, not failed."""
    code, said, seconds, _ = _interrupted_when(tmp_path, "starting", "autocdc-logs/autocdc.log")
    assert (code, said) == (130, INTERRUPTED)
    assert seconds < 5, seconds  # not once the JVM is up, 10-20 s later
    for later in (0.0, 2.0, 5.0):  # the first apply's jobs: as they start, later on
        interrupted = _interrupted_when(tmp_path, f"applying-{later:g}", "applying", later)
        assert interrupted[:2] == (130, INTERRUPTED), later
        spec = interrupted[3]
        log = DeltaTable(str(spec.parent / "storage" / "event_log")).to_pyarrow_table()
        ended = [
            (r["event_type"], r["error_class"], r["message"])
            for r in sorted(log.to_pylist(), key=lambda r: r["event_time"])
            if r["event_type"].startswith("run_")
        ]
        assert ended == [("run_started", None, None), ("run_stopped", None, STOPPED)], later
        assert cli.main(["status", "--spec", str(spec)]) == 0
        first = capsys.readouterr().out.splitlines()[0]
        assert " stopped (interrupted by the user) (started " in first, first


STREAMING_FLOWS = ("latest", "history_cdc", "raw")


def _three_flows(tmp_path, name: str, **settings: str):
    """A project of an SCD1, an SCD2 and an append flow over one folder of change files."""
    config = {**SMALL_SPARK, "spark.sql.warehouse.dir": str(tmp_path / "warehouse"), **settings}
    files = {"feed.py": PYSPARK_SCD1, "history.sql": SQL_SCD2, "raw.py": RAW}
    return write_project(tmp_path, name, files, config)


def _converged(spark, tables, changes) -> bool:
    def load(name: str) -> list:
        try:  # not there yet, or created but not committed yet
            return spark.read.format("delta").load(str(tables / name)).collect()
        except AnalysisException:
            return []

    latest = {r.id: (r.a, r.b) for r in load("latest")}
    history = {(r.id, (r.a, r.b), r["__START_AT"], r["__END_AT"]) for r in load("history")}
    return (latest, history, len(load("raw"))) == (
        fold_scd1(changes),
        fold_scd2(changes),
        len(changes),
    )


@pytest.mark.e2e
def test_kills_as_each_flows_first_micro_batch_starts_converge(spark, tmp_path):
    """SIGKILL at a random moment just after a flow's query starts writing its checkpoint
    (its first offsets entry: a kill there once left a checkpoint Spark refused forever),
    a different flow each run, then a run to the end: every target is the reference."""
    rng = random.Random(SEED)
    spec = _three_flows(tmp_path, "first_batch")
    drop(tmp_path, "1", EVERYTHING)
    checkpoints = tmp_path / "storage" / "checkpoints"
    story = []
    for flow in rng.sample(STREAMING_FLOWS, len(STREAMING_FLOWS)):
        proc = start(spec, None)
        while not (checkpoints / flow / "offsets").is_dir() and proc.poll() is None:
            time.sleep(0.01)
        later = rng.uniform(0.0, 0.4)
        time.sleep(later)
        proc.send_signal(signal.SIGKILL)
        story.append((flow, round(later, 3), finish(proc)))
    assert finish(start(spec, None)) == 0, story
    tables = tmp_path / "warehouse" / "first_batch.db"
    assert _converged(spark, tables, EVERYTHING), (SEED, story)


@pytest.mark.e2e
def test_a_continuous_run_retries_a_failing_flow_while_the_others_run(spark, tmp_path):
    """The SCD1 flow's micro-batch fails twice (an injected fault, not autocdc's error) in
    a continuous run: it starts again from its checkpoint and converges, the other flows
    never stop, new changes arriving meanwhile are applied, and `autocdc status` tells."""
    spec = _three_flows(
        tmp_path, "retried", **{"spark.sql.pipelines.execution.watchdog.minRetryTime": "1s"}
    )
    drop(tmp_path, "1", EVERYTHING[:7])
    env = {**child_env(), FAIL_ENV: "apply:latest@2"}
    command = [sys.executable, "-m", "autocdc", "run", "--continuous", "--spec", str(spec)]
    proc = subprocess.Popen(
        [*command, "--trigger-interval", "1s"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    tables = tmp_path / "warehouse" / "retried.db"
    try:
        deadline = time.monotonic() + 300
        while not _converged(spark, tables, EVERYTHING[:7]):
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(1)
        drop(tmp_path, "2", EVERYTHING[7:])
        while not _converged(spark, tables, EVERYTHING):
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(1)
    finally:
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, output[-3000:]
    assert "autocdc: flow latest: failed (InjectedFault: " in output

    log = spark.read.format("delta").load(str(tmp_path / "storage" / "event_log"))
    retried = log.where("event_type = 'flow_retry'").orderBy("event_time").collect()
    assert [(r.flow, r.error_class) for r in retried] == [("latest", "InjectedFault")] * 2
    assert log.where("event_type = 'error'").count() == 0
    started = log.where("event_type = 'flow_started'").groupBy("flow").count().collect()
    counts = {r.flow: r["count"] for r in started}
    assert counts == {"latest": 3, "history_cdc": 1, "raw": 1, "live_keys": 1}

    status = subprocess.run(
        [sys.executable, "-m", "autocdc", "status", "--spec", str(spec)],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "latest: started again 2 times in its last run after failures" in status.stdout
