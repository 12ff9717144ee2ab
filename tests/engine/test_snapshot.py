"""Snapshot flows (AUTO CDC FROM SNAPSHOT): each full snapshot is diffed against the
target into changes at its version, so the target is the reference fold of the changes
the series of snapshots stands for (``reference.snapshot_changes``)."""

from __future__ import annotations

import itertools
import json
import signal

import pytest
from changes import A
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from processes import ROOT, run_worker
from projects import PYSPARK_SCD1, copy_example, drop, run, scd1_rows, scd2_rows, write_project
from reference import fold_scd1, fold_scd2, snapshot_changes

import autocdc
from autocdc.pipelines import errors

SCHEMA = "id int, a string, b int"
EXAMPLE = ROOT / "pipelines" / "snapshots"
_targets = itertools.count()

Rows = dict[int, tuple[str | None, int | None]]


def frame(spark, rows: Rows):
    return spark.createDataFrame([(k, *v) for k, v in rows.items()], SCHEMA)


def source(spark, series: list[tuple[int, Rows]]):
    """A ``next_snapshot`` function over ``series`` (ascending versions)."""

    def next_snapshot(latest: int | None):
        later = [(v, rows) for v, rows in series if latest is None or v > latest]
        return None if not later else (frame(spark, later[0][1]), later[0][0])

    return next_snapshot


ROWS = st.dictionaries(
    st.integers(0, 4),
    st.tuples(st.sampled_from(["x", "y", None]), st.sampled_from([0, 1, None])),
    min_size=1,
    max_size=4,
)
SERIES = st.tuples(
    st.lists(st.integers(0, 10**12), min_size=3, max_size=3, unique=True).map(sorted),
    st.lists(ROWS, min_size=3, max_size=3),
).map(lambda pair: list(zip(*pair, strict=True)))


@pytest.mark.parametrize("mode", ["scd1", "scd2"])
@settings(suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(series=SERIES, stop=st.integers(1, 2))
def test_snapshots_fold_as_their_changes(spark, mode, series, stop):
    """Three snapshots at ascending versions with gaps, through a ``next_snapshot``
    function: the first ``stop`` in one run, the rest by a fresh flow object (which reads
    the recorded version). SCD1: the last snapshot; SCD2: the fold of the changes."""
    target = f"snap_{mode}_{next(_targets)}"
    # Random snapshots delete any share of the target: the guard is tested on its own.
    options = {"stored_as_scd_type": 1 if mode == "scd1" else 2, "max_delete_fraction": None}
    flow = autocdc.AutoCdcSnapshotFlow(target=target, keys=["id"], **options)
    first = flow.run(spark, source(spark, series[:stop]))
    later = autocdc.AutoCdcSnapshotFlow(target=target, keys=["id"], **options)
    rest = later.run(spark, source(spark, series))
    assert [*first, *rest] == [v for v, _ in series]
    assert later.last_version(spark) == series[-1][0]

    changes = snapshot_changes(series)
    if mode == "scd1":
        assert scd1_rows(spark, target) == fold_scd1(changes) == series[-1][1]
    else:
        assert scd2_rows(spark, target) == fold_scd2(changes)


def test_refused_snapshots_write_nothing(spark, new_table):
    """A version not above the last, a duplicate key, a NULL key (of a composite key), a
    reserved column and a malformed ``next_snapshot`` result are refused with their own
    class and params, the target untouched; a map column compares as JSON (an equal map is
    no change, and a map in another key order is another JSON text: a change)."""
    target = new_table("snap_refused")
    schema = "id int, k string, a string, m map<string,int>"
    flow = autocdc.AutoCdcSnapshotFlow(target=target, keys=["id", "k"])
    rows = [(1, "p", "x", {"z": 1, "y": 2}), (2, "p", "y", None), (2, "q", "z", {})]
    flow.apply(spark.createDataFrame(rows, schema), 5)
    commits = spark.sql(f"DESCRIBE HISTORY {target}").count()

    def refused(error, snapshot, version):
        with pytest.raises(error) as raised:
            flow.apply(spark.createDataFrame(snapshot, schema), version)
        return raised.value.params

    params = refused(autocdc.SnapshotVersionNotNewerError, rows, 5)
    assert params == {"target": target, "version": 5, "last": 5}
    duplicate = [*rows, (2, "q", "other", None)]
    params = refused(autocdc.SnapshotDuplicateKeyError, duplicate, 6)
    assert params == {"target": target, "version": 6, "key": {"id": 2, "k": "q"}, "rows": 2}
    params = refused(autocdc.SnapshotNullKeyError, [*rows, (3, None, "n", None)], 6)
    assert params == {
        "target": target,
        "version": 6,
        "key": {"id": 3, "k": None},
        "columns": ["k"],
    }
    with pytest.raises(autocdc.ReservedColumnError):
        flow.apply(spark.createDataFrame([(1, 9)], "id int, __snapshot_version long"), 6)
    with pytest.raises(autocdc.SnapshotInvalidVersionError) as raised:
        flow.run(spark, lambda latest: (spark.createDataFrame(rows, schema), "6"))
    assert raised.value.params == {"target": target, "got": "'6'"}
    assert spark.sql(f"DESCRIBE HISTORY {target}").count() == commits
    assert flow.last_version(spark) == 5

    # (2, p) changed, the other maps equal: one change.
    changed = [(1, "p", "x", {"z": 1, "y": 2}), (2, "p", "y2", None), (2, "q", "z", {})]
    metrics = flow.apply(spark.createDataFrame(changed, schema), 6)
    assert (metrics.rows_in, metrics.upserted, metrics.deleted) == (1, 1, 0)
    got = {(r.id, r.k, r.a) for r in spark.table(target).collect()}
    assert got == {(1, "p", "x"), (2, "p", "y2"), (2, "q", "z")}


def test_a_snapshot_deleting_most_of_the_target_is_refused_unless_expected(spark, new_table):
    """An empty or partial read (a failed export) looks like mass deletes: a snapshot that
    deletes more than max_delete_fraction (default 0.5) of the target's rows is refused
    before anything is written; the same snapshot applies when the apply expects it, or
    under a flow whose fraction allows it. Deleting exactly the fraction is allowed."""
    target = new_table("snap_guard")
    flow = autocdc.AutoCdcSnapshotFlow(target=target, keys=["id"])
    flow.apply(frame(spark, {1: ("a", 1), 2: ("b", 2), 3: ("c", 3), 4: ("d", 4)}), 1)
    commits = spark.sql(f"DESCRIBE HISTORY {target}").count()

    with pytest.raises(autocdc.SnapshotMassDeleteError) as raised:
        flow.apply(frame(spark, {1: ("a", 1)}), 2)
    assert raised.value.params == {
        "target": target,
        "version": 2,
        "deletes": 3,
        "rows": 4,
        "share": "75%",
        "limit": 0.5,
    }
    with pytest.raises(autocdc.SnapshotMassDeleteError):
        flow.run(spark, source(spark, [(2, {})]))
    assert spark.sql(f"DESCRIBE HISTORY {target}").count() == commits
    assert flow.last_version(spark) == 1

    half = flow.apply(frame(spark, {1: ("a", 1), 2: ("b", 20)}), 2)  # 2 of 4: allowed
    assert (half.upserted, half.deleted) == (1, 2)
    most = flow.apply(frame(spark, {}), 3, expect_deletes=True)
    assert most.deleted == 2 and scd1_rows(spark, target) == {}
    lenient = autocdc.AutoCdcSnapshotFlow(target=target, keys=["id"], max_delete_fraction=1)
    lenient.apply(frame(spark, {5: ("e", 5)}), 4)
    assert lenient.apply(frame(spark, {}), 5).deleted == 1


@pytest.mark.e2e
def test_killed_snapshot_run_then_another_snapshot(spark, warehouse):
    """A process killed after its first snapshot's target commit (state and version not
    recorded); then this process reads other rows from the view, numbered by run: they
    get version 2, not the 1 the killed run used (changes of two contents at one version
    would tie). Then the same rows again: nothing written, version 3 recorded."""
    target = "snap_killed"
    s1: Rows = {1: ("x", 1), 2: ("y", 2), 3: ("z", None)}
    s2: Rows = {1: ("x", 1), 2: ("y2", 2), 4: ("w", 4)}
    rows = [[k, *v] for k, v in s1.items()]
    code = run_worker(warehouse, target, {"snapshot": rows}, "after_target_commit", scd_type=2)
    assert code == -signal.SIGKILL

    flow = autocdc.AutoCdcSnapshotFlow(target=target, keys=["id"], stored_as_scd_type=2)
    assert flow.last_version(spark) is None
    frame(spark, s2).createOrReplaceTempView("snap_killed_source")
    assert list(flow.run(spark, "snap_killed_source")) == [2]
    assert scd2_rows(spark, target) == fold_scd2(snapshot_changes([(1, s1), (2, s2)]))
    again = flow.run(spark, "snap_killed_source")
    assert list(again) == [3] and again[3].rows_in == 0
    assert scd2_rows(spark, target) == fold_scd2(snapshot_changes([(1, s1), (2, s2)]))


PYTHON_SNAPSHOTS = """
from pathlib import Path
from autocdc import pipelines as dp

def next_snapshot(latest):
    versions = sorted(int(p.stem) for p in Path("{data}").glob("*.json"))
    later = [v for v in versions if latest is None or v > latest]
    if not later:
        return None
    return spark.read.schema("id INT, a STRING, b INT").json(f"{data}/{{later[0]}}.json"), later[0]

dp.create_streaming_table("latest")
dp.create_auto_cdc_from_snapshot_flow(target="latest", source=next_snapshot, keys=["id"])
"""
SQL_SNAPSHOTS = """
CREATE OR REFRESH STREAMING TABLE history;
CREATE FLOW history_snapshots AS AUTO CDC INTO history
FROM SNAPSHOT {db}.source
KEYS (id)
STORED AS SCD TYPE 2
TRACK HISTORY ON * EXCEPT (b);
"""


def test_pipeline_python_function_and_sql_table(spark, tmp_path, new_table):
    """A ``next_snapshot`` function over files (SCD1) and ``FROM SNAPSHOT`` over a Delta
    table (SCD2, b untracked, versions the table's), over two runs: a file and the table,
    then a later file and the table changed (three statements, one snapshot). Then the
    unchanged table is not processed again, and the first snapshot reads back with as_of."""
    database = new_table("snap_pipe")
    source = f"{database}.source"
    spark.sql(f"CREATE DATABASE IF NOT EXISTS {database}")
    spark.sql(f"CREATE TABLE {source} (id INT, a STRING, b INT) USING delta")
    spark.sql(f"INSERT INTO {source} VALUES (1, 'x', 1), (2, 'y', 2), (3, 'z', 3)")
    spec = write_project(
        tmp_path, database, {"latest.py": PYTHON_SNAPSHOTS, "history.sql": SQL_SNAPSHOTS}
    )
    files: list[tuple[int, Rows]] = [(2, {1: ("x", 1), 2: ("y", None)}), (7, {2: ("y2", 2)})]
    table_versions: list[tuple[int, Rows]] = []

    def next_run(version: int, rows: Rows) -> None:
        """A snapshot file and the source table's snapshot, then a run."""
        lines = [json.dumps({"id": k, "a": a, "b": b}) for k, (a, b) in rows.items()]
        (tmp_path / "data").mkdir(exist_ok=True)
        (tmp_path / "data" / f"{version}.json").write_text("\n".join(lines) + "\n")
        table_version = spark.sql(f"DESCRIBE HISTORY {source} LIMIT 1").first().version
        table = {r.id: (r.a, r.b) for r in spark.table(source).collect()}
        table_versions.append((table_version, table))
        run(spark, spec)

    next_run(*files[0])
    assert scd1_rows(spark, f"{database}.latest") == files[0][1]
    spark.sql(f"UPDATE {source} SET a = 'x2' WHERE id = 1")
    spark.sql(f"UPDATE {source} SET b = 20 WHERE id = 2")  # untracked: in place
    spark.sql(f"DELETE FROM {source} WHERE id = 3")
    next_run(*files[1])
    assert scd1_rows(spark, f"{database}.latest") == files[1][1]
    expected = fold_scd2(snapshot_changes(table_versions), tracked=[0])
    assert scd2_rows(spark, f"{database}.history") == expected

    history = autocdc.AutoCdcSnapshotFlow(
        target=f"{database}.history", keys=["id"], stored_as_scd_type=2
    )
    assert history.last_version(spark) == table_versions[-1][0]
    assert history.run(spark, source) == {}
    first, rows = table_versions[0]  # b untracked: as of then, with the b of now
    assert {r.id: r.a for r in history.as_of(spark, first).collect()} == {
        k: a for k, (a, _) in rows.items()
    }

    # An emptied source (a failed export looks the same) is held by the guard on deletes
    # until a run expects it.
    spark.sql(f"DELETE FROM {source}")
    with pytest.raises(autocdc.SnapshotMassDeleteError):
        run(spark, spec)
    assert scd2_rows(spark, f"{database}.history") == expected
    run(spark, spec, expect_deletes={"history"})
    assert history.current(spark).count() == 0


def test_pipeline_refuses_a_snapshot_flow_beside_a_change_flow(spark, tmp_path, new_table):
    database = new_table("snap_shared")
    drop(tmp_path, "1", A)
    snapshot = "CREATE FLOW snap AS AUTO CDC INTO latest FROM SNAPSHOT changes KEYS (id);"
    spec = write_project(tmp_path, database, {"feed.py": PYSPARK_SCD1, "snap.sql": snapshot})
    with pytest.raises(errors.SnapshotTargetSharedError) as raised:
        run(spark, spec)
    params = raised.value.params
    assert (params["flow"], params["other"], params["target"]) == ("snap", "latest", "latest")
    assert params["where"] == "transformations/snap.sql:1"
    assert [t.name for t in spark.catalog.listTables(database) if not t.isTemporary] == []


def test_example_pipeline(spark, tmp_path, new_table):
    """pipelines/snapshots (a Python next_snapshot over daily exports, SCD2 with email
    untracked; SQL FROM SNAPSHOT over a view, SCD1), on a copy."""
    database = new_table("snap_example")
    run(spark, copy_example(EXAMPLE, tmp_path / "snapshots", database))

    customers = spark.table(f"{database}.customers").collect()
    assert {(r.id, r.city, r.email, r["__START_AT"], r["__END_AT"]) for r in customers} == {
        (1, "Lyon", "ada@example.org", 20260101, 20260102),
        (1, "Paris", "ada@example.org", 20260102, None),
        (2, "Rome", "bob@example.net", 20260101, None),
        (3, "Oslo", "cyd@example.org", 20260101, 20260102),
        (3, "Oslo", "cyd@example.org", 20260105, None),
        (4, "Kyiv", "dee@example.org", 20260102, None),
    }
    products = spark.table(f"{database}.products").collect()
    assert {(r.sku, r.name, r.price) for r in products} == {
        ("K-100", "Kettle", 25),
        ("T-200", "Toaster", 40),
        ("M-300", "Mixer", 90),
    }
