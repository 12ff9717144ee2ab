"""A snapshot flow and change flows into one SCD type 1 target (autocdc.engine.clock): the
target is the reference fold of the changes and the snapshots
(``reference.fold_scd1_shared``), whatever their arrival order and batching."""

from __future__ import annotations

import itertools
import random

import pytest
from changes import A, feed_flow, rows
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from projects import PYSPARK_SCD1, drop, run, scd1_rows, write_project
from reference import DELETE, UPSERT, Change, Snapshot, fold_scd1_shared

import autocdc
from autocdc.engine.errors import (
    DefinitionChangedError,
    SnapshotPositionError,
    SnapshotSequenceError,
)
from autocdc.pipelines.declare.sql import parse

FEED = "id int, a string, b int, op string, seq bigint"
ROWS = "id int, a string, b int"
_targets = itertools.count()


def snapshot_flow(target: str, at: int | str) -> autocdc.AutoCdcSnapshotFlow:
    """The snapshot flow into ``target``, at position ``at`` (a literal) or read from the
    snapshot's column ``at``."""
    position = at if isinstance(at, str) else f"CAST({at} AS BIGINT)"
    return autocdc.AutoCdcSnapshotFlow(
        target=target, keys=["id"], sequence_by=position, max_delete_fraction=None
    )


def snapshot_frame(spark, snapshot: Snapshot):
    return spark.createDataFrame([(k, *v) for k, v in snapshot.rows], ROWS)


def changes_frame(spark, changes: list[Change]):
    return spark.createDataFrame(rows(changes), FEED)


# --- declarations, no Spark --------------------------------------------------------------


def test_a_snapshot_shares_only_an_scd1_target_on_one_clock():
    with pytest.raises(SnapshotSequenceError) as refused:
        autocdc.AutoCdcSnapshotFlow(target="t", keys=["id"], stored_as_scd_type=2, sequence_by="at")
    assert refused.value.params["flow"] == "t"
    with pytest.raises(SnapshotSequenceError):
        feed_flow("t", scd_type=2, snapshot_target=True)
    with pytest.raises(SnapshotSequenceError):
        feed_flow("t", snapshot_target=True, sequence_groups={"g": ["a", "b"]}, sequence_group="g")


def test_sql_snapshot_flow_takes_sequence_by():
    (statement,) = parse(
        "CREATE FLOW s AS AUTO CDC INTO t FROM SNAPSHOT v KEYS (id) SEQUENCE BY at;", "p.sql"
    )
    assert (statement.target, statement.source, statement.sequence_by) == ("t", "v", "at")


def test_reference_snapshot_covers_every_change_at_or_below_its_sequence():
    changes = [
        Change(1, 5, UPSERT, ("old", 1)),  # older: the snapshot's row wins
        Change(2, 3, UPSERT, ("b", 1)),
        Change(2, 12, DELETE),  # newer: deletes the snapshot's row
        Change(3, 10, UPSERT, ("tie", 1)),  # at the snapshot's sequence: covered by it
        Change(4, 7, UPSERT, ("late", 1)),  # older, key absent from the snapshot: deleted
        Change(5, 11, UPSERT, ("new", 1)),  # newer, key absent from the snapshot: kept
    ]
    snapshot = Snapshot(10, ((1, ("s1", 0)), (2, ("s2", 0))))
    assert fold_scd1_shared(changes, [snapshot]) == {1: ("s1", 0), 5: ("new", 1)}


# --- against Spark -----------------------------------------------------------------------

KEYS = st.integers(0, 4)
VALUES = st.tuples(st.sampled_from(["x", "y", None]), st.sampled_from([0, 1, None]))
CHANGES = st.lists(
    st.one_of(
        st.builds(lambda k, s, v: Change(k, s, UPSERT, v), KEYS, st.integers(0, 8), VALUES),
        st.builds(lambda k, s: Change(k, s, DELETE), KEYS, st.integers(0, 8)),
    ),
    min_size=1,
    max_size=10,
)
SNAPSHOTS = st.lists(
    st.builds(
        lambda seq, rows: Snapshot(seq, tuple(sorted(rows.items()))),
        st.integers(0, 8),
        st.dictionaries(KEYS, VALUES, max_size=4),
    ),
    min_size=1,
    max_size=2,
)


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(changes=CHANGES, snapshots=SNAPSHOTS, seed=st.integers(0, 2**16))
def test_changes_and_snapshots_fold_as_the_reference_whatever_the_arrival(
    spark, changes, snapshots, seed
):
    """The changes shuffled into up to two batches (one resent), the snapshots (empty
    ones too: a literal position) applied between them in a random order: the target is
    the reference fold of the set, ties at a snapshot's sequence included."""
    rng = random.Random(seed)
    target = f"snap_shared_{next(_targets)}"
    shuffled = rng.sample(changes, len(changes))
    cuts = sorted(rng.sample(range(1, len(shuffled)), min(1, len(shuffled) - 1)))
    batches = [shuffled[i:j] for i, j in zip([0, *cuts], [*cuts, len(shuffled)], strict=True)]
    batches.append(rng.choice(batches))  # a batch resent
    arrivals: list[list[Change] | Snapshot] = [*batches, *snapshots]
    rng.shuffle(arrivals)
    flow = feed_flow(target, snapshot_target=True)
    for version, arrival in enumerate(arrivals, start=1):
        if isinstance(arrival, Snapshot):
            snapshot_flow(target, arrival.seq).apply(snapshot_frame(spark, arrival), version)
        elif arrival:
            flow.apply(changes_frame(spark, arrival))
    assert scd1_rows(spark, target) == fold_scd1_shared(changes, snapshots)


def test_a_late_older_change_loses_to_the_snapshot_and_a_newer_one_wins(spark, new_table):
    """The snapshot first, its position read from a column kept out of the target; then
    changes older than it, at it, and newer, in two batches in reverse order."""
    target = new_table("shared")
    snapshot = spark.createDataFrame(
        [(1, "s1", 0, 10), (2, "s2", 0, 10), (3, "s3", 0, 10)], f"{ROWS}, at bigint"
    )
    flow = feed_flow(target, snapshot_target=True)
    metrics = snapshot_flow(target, "at").apply(snapshot, version=1)
    assert metrics.truncates == 1 and metrics.rows_in == 4
    assert spark.table(target).columns == ["id", "a", "b"]
    newer = [Change(2, 12, DELETE), Change(4, 11, UPSERT, ("new", 1))]
    older = [
        Change(1, 5, UPSERT, ("old", 1)),
        Change(3, 10, DELETE),  # at the snapshot's sequence: covered by it
        Change(5, 7, UPSERT, ("late", 1)),  # a key the snapshot lacks: deleted below it
    ]
    flow.apply(changes_frame(spark, newer))
    flow.apply(changes_frame(spark, older))
    expected = {1: ("s1", 0), 3: ("s3", 0), 4: ("new", 1)}
    taken = Snapshot(10, ((1, ("s1", 0)), (2, ("s2", 0)), (3, ("s3", 0))))
    assert scd1_rows(spark, target) == expected == fold_scd1_shared([*newer, *older], [taken])


def test_incomparable_or_unsettled_positions_are_refused(spark, new_table):
    """A position of another type than the change flows' sequence, a target built without
    the shared clock, a snapshot with several positions or a NULL one: refused before
    anything is written."""
    target = new_table("shared_refused")
    feed_flow(target, snapshot_target=True).apply(changes_frame(spark, A))
    snapshot = spark.createDataFrame([(1, "s", 0, "10")], f"{ROWS}, at string")
    with pytest.raises(SnapshotSequenceError) as refused:
        snapshot_flow(target, "at").apply(snapshot, version=1)
    assert "bigint" in refused.value.params["why"] and "string" in refused.value.params["why"]
    several = spark.createDataFrame([(1, "s", 0, 10), (2, "t", 0, 11)], f"{ROWS}, at bigint")
    with pytest.raises(SnapshotPositionError):
        snapshot_flow(target, "at").apply(several, version=1)
    nulls = spark.createDataFrame([(1, "s", 0, None)], f"{ROWS}, at bigint")
    with pytest.raises(SnapshotPositionError):
        snapshot_flow(target, "at").apply(nulls, version=1)
    empty = spark.createDataFrame([], f"{ROWS}, at bigint")
    with pytest.raises(SnapshotPositionError):
        snapshot_flow(target, "at").apply(empty, version=1)
    assert scd1_rows(spark, target) == {1: ("a1", 1), 2: ("b1", 1)}

    alone = new_table("not_shared")
    feed_flow(alone).apply(changes_frame(spark, A))
    with pytest.raises(SnapshotSequenceError):
        snapshot_flow(alone, 10).apply(snapshot_frame(spark, Snapshot(10, ())), version=1)
    with pytest.raises(DefinitionChangedError):  # the change flow, declared on the clock
        feed_flow(alone, snapshot_target=True).apply(changes_frame(spark, A))


SHARED_SQL = """
CREATE TEMPORARY VIEW exported AS
  SELECT * FROM VALUES (1, 'snap', 9, CAST(3 AS BIGINT)), (9, 'n', 0, CAST(3 AS BIGINT))
  AS t(id, a, b, at);
CREATE FLOW snap AS AUTO CDC INTO latest FROM SNAPSHOT exported KEYS (id) SEQUENCE BY at;
"""


def test_pipeline_snapshot_flow_beside_a_change_flow(spark, tmp_path, new_table):
    """SQL: a snapshot at sequence 3 beside the Python change flow: the change flow is put
    on the shared clock for it; a position of another type is refused when the pipeline
    loads."""
    database = new_table("snap_shared_pipeline")
    drop(tmp_path, "1", A)
    spec = write_project(tmp_path, database, {"feed.py": PYSPARK_SCD1, "snap.sql": SHARED_SQL})
    run(spark, spec)
    snapshot = Snapshot(3, ((1, ("snap", 9)), (9, ("n", 0))))
    expected = fold_scd1_shared(A, [snapshot])
    assert scd1_rows(spark, f"{database}.latest") == expected == {1: ("snap", 9), 9: ("n", 0)}

    other = new_table("snap_shared_refused")
    text = SHARED_SQL.replace("CAST(3 AS BIGINT)", "'3'")
    spec = write_project(tmp_path / "refused", other, {"feed.py": PYSPARK_SCD1, "snap.sql": text})
    drop(tmp_path / "refused", "1", A)
    with pytest.raises(SnapshotSequenceError) as refused:  # the class, not FLOW_INVALID's
        run(spark, spec)
    params = refused.value.params
    assert (params["flow"], params["target"]) == ("snap", f"{other}.latest")
    # the types as declared: the change flow's bigint, not its sequence on the shared clock
    assert params["why"].startswith("change flow `latest`'s sequence is bigint, ")
    assert "position (`sequence_by`) is string" in params["why"]
    assert "struct" not in params["why"] and "__autocdc_tier" not in str(refused.value)
    assert "snap.sql:5" in params["remedy"] and "--full-refresh latest" in params["remedy"]
