"""Two writers on one flow: a commit that raced another is recomputed, never lost.

Each target commit takes the next batch id as its Delta transaction version, so a writer
that read older state loses the race and starts over against the new state.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from changes import feed_flow, rows
from processes import WORKER, child_env, error_tail
from pyspark.sql import DataFrameWriter
from reference import DELETE, UPSERT, Change, fold_scd1, fold_scd2

from autocdc.engine import commit, gc

SCHEMA = "id int, a string, b int, op string, seq long"
MINE = [Change(1, 2, UPSERT, ("mine", 1)), Change(2, 5, DELETE), Change(3, 1, UPSERT, ("c", 3))]
THEIRS = [Change(1, 4, UPSERT, ("theirs", 2)), Change(2, 3, UPSERT, ("b", 2))]


def target_rows(spark, target: str, scd_type: int):
    table = spark.table(target).collect()
    if scd_type == 1:
        return {r.id: (r.a, r.b) for r in table}
    return {(r.id, (r.a, r.b), r["__START_AT"], r["__END_AT"]) for r in table}


def expected(changes: list[Change], scd_type: int):
    return fold_scd1(changes) if scd_type == 1 else fold_scd2(changes)


def before_next_commit(monkeypatch, action) -> list[int]:
    """Run ``action`` just before this writer's next target commit (its state and redo
    are computed); return the batch ids of the target commits tried."""
    real = commit.commit_target
    calls: list[int] = []

    def racing(spark, names, redo, merge, schema):
        calls.append(redo.batch)
        if len(calls) == 1:
            action()
        return real(spark, names, redo, merge, schema)

    monkeypatch.setattr(commit, "commit_target", racing)
    return calls


def before_next_rewrite(monkeypatch, action) -> None:
    """Run ``action`` just before the next compaction's commit."""
    real = gc.rewrite
    done: list[bool] = []

    def racing(spark, table, rows, batch):
        if not done:
            done.append(True)
            action()
        return real(spark, table, rows, batch)

    monkeypatch.setattr(gc, "rewrite", racing)


@pytest.mark.parametrize("scd_type", [1, 2])
def test_a_batch_that_lost_the_race_is_recomputed(spark, new_table, monkeypatch, scd_type):
    target = new_table("race")
    mine, theirs = feed_flow(target, scd_type), feed_flow(target, scd_type)
    mine.apply(spark.createDataFrame(rows(MINE[2:]), SCHEMA))
    other = spark.createDataFrame(rows(THEIRS), SCHEMA)
    calls = before_next_commit(monkeypatch, lambda: theirs.apply(other))
    mine.apply(spark.createDataFrame(rows(MINE[:2]), SCHEMA))
    # This writer tried batch 2 (stalled between its redo and its target commit), the
    # other committed batch 2; Delta skipped this writer's commit, which then made 3.
    assert calls[:3] == [2, 2, 3]
    assert target_rows(spark, target, scd_type) == expected(MINE + THEIRS, scd_type)


def test_a_redo_removed_while_written_is_a_lost_race(spark, new_table, monkeypatch):
    """The writer that commits a batch id removes every redo folder up to it, a loser's
    folder being written too: the loser's failed write is a lost race, recomputed."""
    target = new_table("race_redo")
    mine, theirs = feed_flow(target, 1), feed_flow(target, 1)
    mine.apply(spark.createDataFrame(rows(MINE[2:]), SCHEMA))
    other = spark.createDataFrame(rows(THEIRS), SCHEMA)
    real = DataFrameWriter.parquet
    raced: list[str] = []

    def vanishing(self, path, *args, **kwargs):
        if not raced:
            raced.append(path)
            theirs.apply(other)  # commits this batch id and removes the redo folders
            Path(path).parent.mkdir(parents=True)
            Path(path).write_text("")  # the write now fails, as under a removed folder
        return real(self, path, *args, **kwargs)

    monkeypatch.setattr(DataFrameWriter, "parquet", vanishing)
    mine.apply(spark.createDataFrame(rows(MINE[:2]), SCHEMA))
    assert raced and not Path(raced[0]).parent.exists()
    assert target_rows(spark, target, 1) == expected(MINE + THEIRS, 1)


def test_compaction_never_overwrites_a_concurrent_batch(spark, new_table, monkeypatch):
    target = new_table("race_gc")
    mine, theirs = feed_flow(target, 1), feed_flow(target, 1)
    mine.apply(spark.createDataFrame(rows(MINE), SCHEMA))
    other = spark.createDataFrame(rows(THEIRS), SCHEMA)
    before_next_rewrite(monkeypatch, lambda: theirs.apply(other))
    mine.collect_tombstones(spark)
    assert target_rows(spark, target, 1) == expected(MINE + THEIRS, 1)
    # The state still holds the other writer's batch (key 1 at 4): 3 stays stale.
    mine.apply(spark.createDataFrame(rows([Change(1, 3, UPSERT, ("old", 0))]), SCHEMA))
    assert target_rows(spark, target, 1) == expected(MINE + THEIRS, 1)


@pytest.mark.e2e
def test_two_processes_applying_and_compacting_at_once(spark, tmp_path):
    """Two real processes on one target, each applying batches and compacting after
    every batch; the result is the reference fold of everything both applied."""
    target = "shared"
    first = [[Change(k, s, UPSERT, (f"p1-{s}", s))] for k, s in [(1, 1), (2, 3), (1, 5)]]
    second = [[Change(k, s, UPSERT, (f"p2-{s}", s))] for k, s in [(1, 2), (2, 4), (3, 6)]]
    second[1].append(Change(1, 4, DELETE))
    env = {**child_env(), "AUTOCDC_TEST_COLLECT": "1"}
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(WORKER),
                str(tmp_path),
                target,
                json.dumps({"batches": [rows(b) for b in batches]}),
                "1",
            ],
            env=env,
            cwd=WORKER.parent,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for batches in (first, second)
    ]
    outputs = [p.communicate(timeout=900) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [error_tail(err) for _, err in outputs]
    table = spark.read.format("delta").load(str(tmp_path / target))
    got = {r.id: (r.a, r.b) for r in table.collect()}
    everything = [c for batch in first + second for c in batch]
    assert got == fold_scd1(everything)
