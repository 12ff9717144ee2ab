"""Kill a real process at several points inside ``apply``; the target must converge.

One chain on one target, each step a fresh process (so tables are also found by name
across processes): a crash between the state and target commits followed by a
*different* batch, a crash after quarantining then a replay, a crash after the target
commit then a replay, and a clean batch last.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from reference import DELETE, UPSERT, Change, fold_scd1, fold_scd2

from autocdc.flow import CRASH_ENV

WORKER = Path(__file__).with_name("crash_worker.py")

A = [Change(1, 2, UPSERT, ("a1", 1)), Change(2, 1, UPSERT, ("b1", 1)), Change(3, 5, DELETE)]
B = [Change(2, 3, UPSERT, ("b2", 2)), Change(3, 4, UPSERT, ("c-old", 0)), Change(1, 1, DELETE)]
C = [Change(1, 6, DELETE), Change(4, 1, UPSERT, ("d1", None)), Change(2, 3, UPSERT, ("b2", 2))]
NULL_KEY_ROW = (None, "lost?", 0, "U", 9)


def rows(changes: list[Change]) -> list[tuple]:
    return [(c.key, *(c.values or (None, None)), c.op, c.seq) for c in changes]


def run(
    warehouse: Path, target: str, batch: list[tuple], crash_at: str | None, scd_type: int = 1
) -> int:
    env = {k: v for k, v in os.environ.items() if k != CRASH_ENV}
    if crash_at:
        env[CRASH_ENV] = crash_at
    done = subprocess.run(
        [sys.executable, str(WORKER), str(warehouse), target, json.dumps(batch), str(scd_type)],
        env=env,
        cwd=WORKER.parent,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode in (0, -signal.SIGKILL), done.stderr[-3000:]
    return done.returncode


@pytest.mark.slow
def test_killed_applies_converge(spark, tmp_path):
    target = "crashed"
    steps = [
        (rows(A), "after_state_commit"),
        ([*rows(B), NULL_KEY_ROW], "after_quarantine"),
        ([*rows(B), NULL_KEY_ROW], "after_target_commit"),
        (rows(C), None),
    ]
    codes = [run(tmp_path, target, batch, crash) for batch, crash in steps]
    assert codes == [-signal.SIGKILL, -signal.SIGKILL, -signal.SIGKILL, 0]

    table = spark.read.format("delta").load(str(tmp_path / target))
    got = {r.id: (r.a, r.b) for r in table.collect()}
    assert got == fold_scd1(A + B + C)
    quarantine = spark.read.format("delta").load(str(tmp_path / f"{target}__autocdc_quarantine"))
    assert [r.reason for r in quarantine.collect()] == ["AUTOCDC_NULL_KEY"]


@pytest.mark.slow
def test_killed_history_apply_converges(spark, tmp_path):
    """SCD type 2: killed between the log commit and the target commit, then a
    different batch; the history equals the reference fold of both."""
    target = "crashed_history"
    codes = [
        run(tmp_path, target, rows(A + B), "after_state_commit", scd_type=2),
        run(tmp_path, target, rows(C), None, scd_type=2),
    ]
    assert codes == [-signal.SIGKILL, 0]
    table = spark.read.format("delta").load(str(tmp_path / target))
    got = {(r.id, (r.a, r.b), r["__START_AT"], r["__END_AT"]) for r in table.collect()}
    assert got == fold_scd2(A + B + C)
