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

import pytest
from changes import EVERYTHING
from processes import child_env, finish, start
from projects import PYSPARK_SCD1, SQL_SCD2, drop, write_project
from reference import fold_scd1, fold_scd2
from sparkconf import SMALL_SPARK

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


@pytest.mark.e2e
def test_ctrl_c_while_a_run_starts_prints_one_line_and_releases_the_lock(tmp_path):
    """SIGINT (Ctrl-C) once the definitions are resolved, as the flows start: exit 130,
    one line saying so (no py4j tracebacks), the lock released."""
    config = {**SMALL_SPARK, "spark.sql.warehouse.dir": str(tmp_path / "warehouse")}
    spec = write_project(tmp_path, "stopped", {"feed.py": PYSPARK_SCD1}, config)
    drop(tmp_path, "1", EVERYTHING)
    env = child_env()
    proc = subprocess.Popen(
        [sys.executable, "-m", "autocdc", "run", "--continuous", "--spec", str(spec)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    first = proc.stdout.readline()  # printed once every definition is resolved
    proc.send_signal(signal.SIGINT)
    rest, _ = proc.communicate(timeout=600)
    assert first.startswith("autocdc: pipeline stopped: "), first + rest
    assert proc.returncode == 130, rest
    assert rest.splitlines() == [
        "autocdc: interrupted (Ctrl-C): every committed batch is kept; the next run goes on "
        "from there"
    ]
    assert not (tmp_path / "storage" / "autocdc-run.lock").exists()
