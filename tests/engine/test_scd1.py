"""SCD type 1 on Spark and Delta: fixed scenarios, each asserting the whole outcome."""

from __future__ import annotations

import pytest
from chispa import assert_df_equality
from pyspark.sql import functions as F
from reference import fold_scd1
from users import (
    EXAMPLE,
    EXPECTED,
    SCHEMA,
    SOLE_FIRST,
    SOLE_SECOND,
    as_changes,
    assert_target,
    operations,
    users_flow,
)

import autocdc
from autocdc.engine import batch as engine_batch
from autocdc.engine import commit
from autocdc.engine import state as st
from autocdc.engine.errors import (
    QUARANTINE_LATE_BEYOND_HORIZON,
    QUARANTINE_NULL_KEY,
    QUARANTINE_NULL_SEQUENCE,
    QUARANTINE_UNKNOWN_CHANGE_TYPE,
)


@pytest.mark.parametrize("ignore_null_updates", [False, True])
def test_a_first_batch_of_one_change_per_key_is_folded_row_by_row_as_the_fold_says(
    spark, new_table, sole_batches, ignore_null_updates
):
    """The first batch (nothing stored, no key twice) skips the shuffle and, the target
    being empty, is appended to it; what it stores (tombstones, winners' hashes,
    per-column sequences) judges the next batch as ever."""
    target = new_table("sole")
    flow = users_flow(target, ignore_null_updates=ignore_null_updates)
    first, _ = [
        flow.apply(spark.createDataFrame(rows, SCHEMA)) for rows in (SOLE_FIRST, SOLE_SECOND)
    ]
    assert sole_batches == [True, False]
    assert operations(spark, target) == ["WRITE", "MERGE"]
    assert (first.upserted, first.deleted, first.tombstones_written) == (4, 0, 1)
    expected = fold_scd1(as_changes(SOLE_FIRST + SOLE_SECOND), ignore_null_updates)
    assert_target(spark, target, [(k, *v) for k, v in expected.items()])


@pytest.mark.parametrize("repeated", [False, True])
def test_a_first_batch_of_dense_integer_keys_is_judged_sole_by_bitmaps_as_by_the_fold(
    spark, new_table, sole_batches, monkeypatch, repeated
):
    """5,000 keys in one range of integers are counted with bitmaps; one key sent twice
    (the later change wins) makes the batch a folded one, not sole."""
    counted: list[int] = []
    real = engine_batch.distinct_integers

    def spy(df, name):
        counted.append(real(df, name))
        return counted[-1]

    monkeypatch.setattr(engine_batch, "distinct_integers", spy)
    target = new_table("dense")
    rows = [(k, f"n{k}", "x", "INSERT", 10) for k in range(1, 5_001)]
    if repeated:
        rows.append((7, "later", "y", "UPDATE", 11))
    users_flow(target).apply(spark.createDataFrame(rows, SCHEMA))
    assert counted == [5_000]
    assert sole_batches == [not repeated]
    expected = fold_scd1(as_changes(rows))
    assert_target(spark, target, [(k, *v) for k, v in expected.items()])


@pytest.mark.parametrize(
    "mode", [{}, {"ignore_null_updates": True}, {"stored_as_scd_type": 2}], ids=str
)
def test_an_initial_load_counts_what_the_general_fold_counts(spark, new_table, monkeypatch, mode):
    """An initial load takes its counts from the batch's, not from a pass over its rows:
    its metrics, its state (whose meta row counts keys, rows and tombstones) and its
    target are what the general fold makes of the same batch, MERGEd into an empty target."""
    first = spark.createDataFrame(SOLE_FIRST, SCHEMA)
    loaded, folded = (users_flow(new_table(name), **mode) for name in ("loaded", "folded"))
    by_load = loaded.apply(first).as_dict()
    for strategy in ("scd1", "scd2"):
        monkeypatch.setattr(f"autocdc.engine.{strategy}.sole_changes", lambda batch: False)
    by_fold = folded.apply(first).as_dict()
    assert (operations(spark, loaded.target), operations(spark, folded.target)) == (
        ["WRITE"],
        ["MERGE"],
    )
    for run in (by_load, by_fold):
        for varying in ("flow", "seconds", "steps"):
            del run[varying]
    assert by_load == by_fold
    for table in ("target", "state_table"):
        assert_df_equality(
            spark.table(getattr(loaded, table)).drop(st.UPDATED_AT),
            spark.table(getattr(folded, table)).drop(st.UPDATED_AT),
            ignore_row_order=True,
        )


def test_a_first_batch_into_a_target_that_holds_rows_is_merged_not_appended(spark, new_table):
    """A flow adopting a table that has rows: its first batch MERGEs (key 1 is updated,
    not added twice; key 7, not in the batch, stays)."""
    target = new_table("adopted")
    held = [(1, "old", "y"), (7, "g", "z")]
    spark.createDataFrame(held, "userId int, name string, city string").write.format(
        "delta"
    ).saveAsTable(target)
    users_flow(target).apply(spark.createDataFrame(SOLE_FIRST, SCHEMA))
    assert operations(spark, target)[-1] == "MERGE"
    expected = fold_scd1(as_changes(SOLE_FIRST))
    assert_target(spark, target, [(k, *v) for k, v in expected.items()] + [held[1]])


def test_worked_example_in_reverse_and_split(spark, new_table):
    target = new_table("users")
    flow = users_flow(target)
    rows = list(reversed(EXAMPLE))
    first = flow.apply(spark.createDataFrame(rows[:4], SCHEMA))
    second = flow.apply(spark.createDataFrame(rows[4:], SCHEMA))
    assert_target(spark, target, EXPECTED)
    assert (first.rows_in, second.rows_in) == (4, 4)
    # Batch 1 holds the delete of 123 (seq 6) before any insert: a tombstone.
    assert first.tombstones_written == 1 and first.deleted == 0
    # Batch 2's older rows for 123 and 125 lose against the state batch 1 left.
    assert second.ignored_stale == 2
    assert second.tombstones_live == 1


def test_replay_and_duplicates_change_nothing(spark, new_table, warehouse):
    target = new_table("users")
    flow = users_flow(target)
    batch = spark.createDataFrame(EXAMPLE + EXAMPLE[:3], SCHEMA)
    metrics = flow.apply(batch)
    # The target is clean (the flow's columns only) and its state sits beside it.
    assert spark.table(target).columns == ["userId", "name", "city"]
    assert (warehouse / target / "_delta_log").is_dir()
    assert (warehouse / f"{target}__autocdc_state" / "_delta_log").is_dir()
    assert metrics.duplicates_dropped == 3
    assert metrics.upserted == 3
    version = spark.sql(f"DESCRIBE HISTORY {target}").count()
    replay = flow.apply(batch)
    assert_target(spark, target, EXPECTED)
    assert (replay.upserted, replay.deleted, replay.ignored_stale) == (0, 0, 8)
    assert spark.sql(f"DESCRIBE HISTORY {target}").count() == version  # no new commit
    # Where each batch's time went: every step it ran, in order, within its seconds.
    ran = ["prepare", "stage", "plan", "quarantine", "redo", "merge", "state", "maintain"]
    assert list(metrics.steps) == ran
    assert list(replay.steps) == ran[:4]  # nothing to commit
    for m in (metrics, replay):
        assert all(s >= 0 for s in m.steps.values())
        assert sum(m.steps.values()) <= m.seconds + 0.01


def test_truncate(spark, new_table):
    target = new_table("users")
    flow = users_flow(target, apply_as_truncates="operation = 'TRUNCATE'")
    flow.apply(spark.createDataFrame(EXAMPLE[:4], SCHEMA))
    rest = [*EXAMPLE[4:], (None, None, None, "TRUNCATE", 3)]
    metrics = flow.apply(spark.createDataFrame(rest, SCHEMA))
    assert_target(spark, target, [(125, "Mercedes", "Guadalajara")])
    assert metrics.truncates == 1
    # A late upsert at or below the truncate stays dead, even for a key never seen.
    flow.apply(spark.createDataFrame([(200, "Late", "X", "INSERT", 3)], SCHEMA))
    assert_target(spark, target, [(125, "Mercedes", "Guadalajara")])


def test_a_truncate_that_changes_no_key_still_moves_the_horizon(spark, new_table):
    """A truncate into an empty target, then one above keys deleted already: each is
    committed (its horizon), so an older upsert arriving after it stays dead."""
    target = new_table("users")
    flow = users_flow(target, apply_as_truncates="operation = 'TRUNCATE'")
    metrics = flow.apply(spark.createDataFrame([(None, None, None, "TRUNCATE", 5)], SCHEMA))
    assert metrics.batch_id == flow.committed_batch(spark) == 1
    flow.apply(spark.createDataFrame([(1, "Old", "X", "INSERT", 4)], SCHEMA))
    assert_target(spark, target, [])
    flow.apply(spark.createDataFrame([(1, None, None, "DELETE", 9)], SCHEMA))
    before = flow.committed_batch(spark)
    metrics = flow.apply(spark.createDataFrame([(None, None, None, "TRUNCATE", 8)], SCHEMA))
    assert metrics.batch_id == flow.committed_batch(spark) == before + 1
    flow.apply(spark.createDataFrame([(2, "Older", "Y", "INSERT", 7)], SCHEMA))
    assert_target(spark, target, [])


@pytest.mark.parametrize("scd_type", [1, 2])
def test_a_change_type_no_condition_names_is_an_upsert_unless_upserts_are_declared(
    spark, new_table, scd_type
):
    """Default (the anchors' rule): a row that is no delete is an upsert, "MERGE" too.
    With ``apply_as_upserts`` declared, it is an unknown change type: quarantined with
    its own reason, the rest applied."""
    unknown = (127, "Who", "Knows", "MERGE", 7)
    plain = users_flow(new_table("types"), stored_as_scd_type=scd_type)
    plain.apply(spark.createDataFrame([*EXAMPLE, unknown], SCHEMA))
    assert spark.table(plain.target).where("userId = 127").count() == 1
    declared = users_flow(
        new_table("types"),
        stored_as_scd_type=scd_type,
        apply_as_upserts="operation IN ('INSERT', 'UPDATE')",
    )
    metrics = declared.apply(spark.createDataFrame([*EXAMPLE, unknown], SCHEMA))
    assert metrics.quarantined == 1
    current = declared.current(spark).select("userId", "name", "city")
    expected = spark.createDataFrame(EXPECTED, "userId int, name string, city string")
    assert_df_equality(current, expected, ignore_row_order=True, ignore_nullable=True)
    reasons = [r.reason for r in spark.table(declared.quarantine_table).collect()]
    assert reasons == [QUARANTINE_UNKNOWN_CHANGE_TYPE]


def test_bad_rows_are_quarantined_rest_applied(spark, new_table):
    target = new_table("users")
    flow = users_flow(target)
    rows = [*EXAMPLE, (None, "No", "Key", "INSERT", 7), (127, "No", "Seq", "INSERT", None)]
    metrics = flow.apply(spark.createDataFrame(rows, SCHEMA))
    assert metrics.quarantined == 2
    assert_target(spark, target, EXPECTED)
    quarantined = spark.table(flow.quarantine_table).select("reason", "row", "sequence")
    expected = spark.createDataFrame(
        [
            (
                QUARANTINE_NULL_KEY,
                '{"city":"Key","name":"No","operation":"INSERT","sequenceNum":7,"userId":null}',
                "7",
            ),
            (
                QUARANTINE_NULL_SEQUENCE,
                '{"city":"Seq","name":"No","operation":"INSERT","sequenceNum":null,"userId":127}',
                None,
            ),
        ],
        "reason string, row string, sequence string",
    )
    assert_df_equality(quarantined, expected, ignore_row_order=True, ignore_nullable=True)
    flow.apply(spark.createDataFrame(rows, SCHEMA))  # replayed: not quarantined twice
    assert spark.table(flow.quarantine_table).count() == 2


def test_errors_raised_before_any_table_is_written(spark, new_table):
    target = new_table("users")
    df = spark.createDataFrame(EXAMPLE, SCHEMA)
    with pytest.raises(autocdc.UnknownColumnError):
        users_flow(target, except_column_list=["operation", "seqNum"]).apply(df)
    with pytest.raises(autocdc.InvalidSequenceTypeError):
        users_flow(target, sequence_by="cast(sequenceNum as double)").apply(df)
    with pytest.raises(autocdc.ReservedColumnError):
        users_flow(target).apply(df.withColumn("__END_AT", F.lit(1)))
    with pytest.raises(autocdc.UnknownColumnError, match=r"`cluster_by` names column.*operation"):
        users_flow(target, cluster_by=["operation"]).apply(df)  # not a target column
    assert not spark.catalog.tableExists(target)


@pytest.mark.parametrize("scd", [1, 2])
def test_a_target_clustered_by_its_keys_takes_batches_and_optimize(spark, new_table, scd):
    """``cluster_by`` and ``table_properties`` are the target's from its creation; the
    MERGEs of later batches and OPTIMIZE (which clusters it) work on it as on any target."""
    target = new_table("users")
    props = {"autocdc.test.owner": "shop", "delta.enableDeletionVectors": "false"}
    flow = users_flow(target, cluster_by=["userId"], table_properties=props, stored_as_scd_type=scd)
    flow.apply(spark.createDataFrame(EXAMPLE[:4], SCHEMA))
    spark.sql(f"OPTIMIZE {target}")
    flow.apply(spark.createDataFrame(EXAMPLE[4:], SCHEMA))
    (detail,) = spark.sql(f"DESCRIBE DETAIL {target}").collect()
    assert detail.clusteringColumns == ["userId"]
    assert props.items() <= detail.properties.items()
    live = spark.table(target).where("__END_AT IS NULL") if scd == 2 else spark.table(target)
    got = sorted(tuple(r) for r in live.select("userId", "name", "city").collect())
    assert got == EXPECTED


def test_ties_are_resolved_the_same_in_one_or_two_batches(spark, new_table):
    a = (1, "Ann", "Berlin", "UPDATE", 5)
    b = (1, "Ann", "Athens", "UPDATE", 5)  # same key and sequence, different row
    one, two, three = new_table("tie"), new_table("tie"), new_table("tie")
    together = users_flow(one).apply(spark.createDataFrame([b, a], SCHEMA))
    users_flow(two).apply(spark.createDataFrame([a], SCHEMA))
    loser_late = users_flow(two).apply(spark.createDataFrame([b], SCHEMA))
    users_flow(three).apply(spark.createDataFrame([b], SCHEMA))
    winner_late = users_flow(three).apply(spark.createDataFrame([a], SCHEMA))
    # The documented rule: the greatest row wins ("Berlin" > "Athens").
    for target in (one, two, three):
        assert_target(spark, target, [(1, "Ann", "Berlin")])
    assert together.conflicts == 1
    # Across batches the target settles a tie (it holds the values): counted as a conflict
    # either way, and only the winner is upserted.
    assert (loser_late.upserted, loser_late.conflicts, loser_late.ignored_stale) == (0, 1, 0)
    assert (winner_late.upserted, winner_late.conflicts) == (1, 1)


def test_ignore_null_updates_out_of_order(spark, new_table):
    target = new_table("partial")
    flow = users_flow(target, ignore_null_updates=True)
    flow.apply(spark.createDataFrame([(1, None, "Lyon", "UPDATE", 3)], SCHEMA))
    flow.apply(spark.createDataFrame([(1, "Ann", "Paris", "INSERT", 1)], SCHEMA))
    assert_target(spark, target, [(1, "Ann", "Lyon")])
    # A late delete between them wipes the name set before it.
    flow.apply(spark.createDataFrame([(1, None, None, "DELETE", 2)], SCHEMA))
    assert_target(spark, target, [(1, None, "Lyon")])


def test_struct_sequence_and_hex_helper(spark, new_table):
    target = new_table("lsn")
    schema = "id int, v string, lsn string, op string"
    flow = autocdc.AutoCdcFlow(
        target=target,
        keys=["id"],
        sequence_by=autocdc.hex_sequence("lsn"),
        apply_as_deletes="op = 'D'",
        except_column_list=["lsn", "op"],
    )
    rows = [
        (1, "new", "16/B374D848", "U"),
        (1, "old", "9/FFFFFFFF", "U"),
        (2, "x", "1/0", "U"),
        (2, None, "1/1", "D"),
        (3, "bad", "zz/1", "U"),
    ]
    metrics = flow.apply(spark.createDataFrame(rows, schema))
    assert_target(spark, target, [(1, "new")], "id int, v string")
    assert metrics.quarantined == 1  # "zz/1" is not a hex sequence


def test_tombstone_collection_and_horizon(spark, new_table):
    target = new_table("gc")
    flow = users_flow(target, tombstone_retention_days=0)
    flow.apply(
        spark.createDataFrame([(1, "A", "X", "INSERT", 1), (2, "B", "Y", "INSERT", 1)], SCHEMA)
    )
    deleted = flow.apply(spark.createDataFrame([(1, None, None, "DELETE", 5)], SCHEMA))
    # An apply leaves collection to compaction (or a maintenance call), never does it
    # on a process's first batch.
    assert (deleted.tombstones_written, deleted.tombstones_collected) == (1, 0)
    assert deleted.tombstones_live == 1
    # Retention 0: the tombstone is collected at once.
    assert flow.collect_tombstones(spark) == 1
    assert flow.collect_tombstones(spark) == 0
    # An upsert of key 1 at or below the horizon (5) cannot be judged: quarantined.
    late = flow.apply(
        spark.createDataFrame([(1, "A", "old", "UPDATE", 4), (3, "C", "Z", "INSERT", 6)], SCHEMA)
    )
    assert (late.late_beyond_horizon, late.quarantined, late.upserted) == (1, 1, 1)
    assert_target(spark, target, [(2, "B", "Y"), (3, "C", "Z")])
    reasons = [r.reason for r in spark.table(flow.quarantine_table).collect()]
    assert reasons == [QUARANTINE_LATE_BEYOND_HORIZON]
    # A reinsert above the horizon is applied.
    flow.apply(spark.createDataFrame([(1, "A", "new", "INSERT", 6)], SCHEMA))
    assert_target(spark, target, [(1, "A", "new"), (2, "B", "Y"), (3, "C", "Z")])
    # A replay of the recreated key's insert and delete is stale (below its reinsert), not
    # late: nothing quarantined.
    old = [(1, "A", "X", "INSERT", 1), (1, None, None, "DELETE", 5)]
    replay = flow.apply(spark.createDataFrame(old, SCHEMA))
    assert (replay.quarantined, replay.ignored_stale) == (0, 2)
    assert_target(spark, target, [(1, "A", "new"), (2, "B", "Y"), (3, "C", "Z")])


def test_late_beyond_horizon_apply_setting(spark, new_table):
    target = new_table("gc")
    flow = users_flow(target, tombstone_retention_days=0, late_beyond_horizon="apply")
    flow.apply(spark.createDataFrame([(1, None, None, "DELETE", 5)], SCHEMA))
    assert flow.collect_tombstones(spark) == 1
    metrics = flow.apply(spark.createDataFrame([(1, "A", "old", "UPDATE", 4)], SCHEMA))
    assert metrics.quarantined == 0
    assert_target(spark, target, [(1, "A", "old")])


def test_state_is_compacted_when_superseded_rows_outnumber_keys(spark, new_table, monkeypatch):
    monkeypatch.setattr(autocdc.engine.gc, "MIN_SUPERSEDED", 1)
    monkeypatch.setattr(commit, "FOLD_EVERY", 1)  # the state table holds every batch
    target = new_table("compact")
    flow = users_flow(target)
    flow.apply(spark.createDataFrame([(1, "A", "X", "INSERT", 1)], SCHEMA))
    flow.apply(spark.createDataFrame([(1, "A", "Y", "UPDATE", 2)], SCHEMA))
    state = spark.table(flow.state_table)
    # Appended: two versions of key 1 and a meta row per batch.
    assert (state.where("__autocdc_kind = 'S'").count(), state.count()) == (2, 4)
    flow.apply(spark.createDataFrame([(1, "A", "Z", "UPDATE", 3)], SCHEMA))
    state = spark.table(flow.state_table)
    # Two superseded rows > one key: rewritten as the current row plus one meta row.
    kinds = state.select("__autocdc_kind", "__autocdc_ups").collect()
    assert sorted(tuple(r) for r in kinds) == [("M", None), ("S", 3)]
    assert_target(spark, target, [(1, "A", "Z")])
    flow.apply(spark.createDataFrame([(1, "A", "Y", "UPDATE", 2)], SCHEMA))  # late: ignored
    assert_target(spark, target, [(1, "A", "Z")])


PARTIAL = "k int, x string, y int, op string, s long"


def partial_flow(target, **overrides):
    spec = {
        "target": target,
        "keys": ["k"],
        "sequence_by": "s",
        "apply_as_deletes": "op = 'D'",
        "except_column_list": ["op", "s"],
        "ignore_null_updates": True,
        "tombstone_retention_days": 0,
    }
    return autocdc.AutoCdcFlow(**{**spec, **overrides})


def test_partial_update_below_the_horizon_is_quarantined(spark, new_table):
    """Issue 18, defect 1: after collection, a key re-created above the horizon cannot
    judge an old partial update (was there a delete between?): quarantined, counted."""
    target = new_table("partial_gc")
    flow = partial_flow(target)
    flow.apply(spark.createDataFrame([(1, "x", 0, "U", 1), (2, "y", 0, "U", 1)], PARTIAL))
    flow.apply(spark.createDataFrame([(1, None, None, "D", 5), (2, None, None, "D", 100)], PARTIAL))
    assert flow.collect_tombstones(spark) == 2  # horizon 100
    flow.apply(spark.createDataFrame([(1, None, 1, "U", 200)], PARTIAL))
    late = flow.apply(spark.createDataFrame([(1, "A", 0, "U", 50)], PARTIAL))
    assert (late.late_beyond_horizon, late.quarantined, late.ignored_stale) == (1, 1, 0)
    assert_target(spark, target, [(1, None, 1)], "k int, x string, y int")
    reasons = [r.reason for r in spark.table(flow.quarantine_table).collect()]
    assert reasons == [QUARANTINE_LATE_BEYOND_HORIZON]


def test_ties_compare_in_the_declared_order_whatever_the_batch_order(spark, new_table):
    """Issue 18, defect 5: values sorted by name (x, y) decide a tie, in either arrival."""
    a = spark.createDataFrame([(3, "mm", "zz", 4)], "k int, x string, y string, s long")
    b = spark.createDataFrame([(3, "aa", "nn", 4)], "k int, y string, x string, s long")
    for first, second in ((a, b), (b, a)):
        target = new_table("tie_order")
        flow = autocdc.AutoCdcFlow(
            target=target, keys=["k"], sequence_by="s", except_column_list=["s"]
        )
        flow.apply(first)
        flow.apply(second)
        got = spark.table(target).select("k", "x", "y")
        assert [tuple(r) for r in got.collect()] == [(3, "nn", "aa")]
    listed = new_table("tie_listed")  # column_list's order decides instead: y first
    flow = autocdc.AutoCdcFlow(
        target=listed, keys=["k"], sequence_by="s", column_list=["k", "y", "x"]
    )
    flow.apply(a)
    flow.apply(b)
    assert [tuple(r) for r in spark.table(listed).select("k", "x", "y").collect()] == [
        (3, "mm", "zz")
    ]


def test_a_crash_between_the_two_alters_changes_no_result(spark, new_table):
    """Issue 18, defect 4: the target gained a column, the state did not (a kill between
    the ALTERs); a batch adding another column then works, and ties keep their order."""
    target = new_table("alter_crash")
    flow = autocdc.AutoCdcFlow(
        target=target,
        keys=["k"],
        sequence_by="s",
        except_column_list=["s"],
        ignore_null_updates=True,
    )
    flow.apply(spark.createDataFrame([(1, "a", 1)], "k int, x string, s long"))
    spark.sql(f"ALTER TABLE {target} ADD COLUMNS (b string)")  # the state ALTER never ran
    batch = spark.createDataFrame(
        [(1, "z", "q", 2), (2, "m", "n", 2)], "k int, c string, b string, s long"
    )
    flow.apply(batch)
    flow.apply(spark.createDataFrame([(1, "y", 2)], "k int, x string, s long"))  # a tie: y > a
    got = {r.k: (r.x, r.b, r.c) for r in spark.table(target).collect()}
    assert got == {1: ("y", "q", "z"), 2: (None, "n", "m")}
    seqs = [c for c in spark.table(flow.state_table).columns if c.startswith("__autocdc_s__")]
    assert sorted(seqs) == ["__autocdc_s__b", "__autocdc_s__c", "__autocdc_s__x"]


def test_a_column_name_with_a_backtick(spark, new_table):
    """Issue 18, defect 6: ``q`r`` works like any other name (as key and as value)."""
    target = new_table("backtick")
    flow = autocdc.AutoCdcFlow(
        target=target, keys=["k`ey"], sequence_by="s", except_column_list=["s"]
    )
    schema = "`k``ey` int, `q``r` string, s long"
    flow.apply(spark.createDataFrame([(1, "a", 1), (2, "b", 1)], schema))
    flow.apply(spark.createDataFrame([(1, "c", 2), (2, "a", 0)], schema))
    assert sorted(tuple(r) for r in spark.table(target).collect()) == [(1, "c"), (2, "b")]


def test_a_state_table_of_the_old_format_is_refused(spark, new_table):
    target = new_table("old_state")
    flow = users_flow(target)
    flow.apply(spark.createDataFrame(EXAMPLE[:2], SCHEMA))
    state = flow.state_table
    spark.sql(f"ALTER TABLE {state} UNSET TBLPROPERTIES ('autocdc.stateFormat')")
    with pytest.raises(autocdc.StateFormatError) as raised:
        users_flow(target).apply(spark.createDataFrame(EXAMPLE[2:], SCHEMA))
    assert raised.value.params == {"table": state, "found": "1", "expected": "2"}
    assert_target(spark, target, [(124, "Raul", "Oaxaca"), (123, "Isabel", "Monterrey")])


def test_a_state_table_holding_every_batch_keeps_working(spark, new_table, monkeypatch):
    """Targets written before the state was kept pending: every batch appended to the
    state table, no redo folder left. The next batches read it as it is (nothing pending)
    and keep their own state pending."""
    target = new_table("every_batch_folded")
    flow = users_flow(target)
    late_first = sorted(EXAMPLE, key=lambda r: -r[4])
    monkeypatch.setattr(commit, "FOLD_EVERY", 1)  # as before: each batch into the table
    for row in late_first[:4]:
        flow.apply(spark.createDataFrame([row], SCHEMA))
    commit.drop_redo(spark, flow._names)
    committed = spark.table(flow.state_table).where("__autocdc_kind = 'M'").count()
    monkeypatch.undo()
    for row in late_first[4:] + EXAMPLE[:2]:  # pending, and two replays
        users_flow(target).apply(spark.createDataFrame([row], SCHEMA))
    assert_target(spark, target, EXPECTED)
    assert spark.table(flow.state_table).where("__autocdc_kind = 'M'").count() == committed
    assert list(flow._names.redo_root(spark).iterdir())  # the new batches' state: pending
