"""SCD type 2: the documented examples and out-of-order splits (the reference fold is
checked for every mode in test_properties.py)."""

from __future__ import annotations

import pytest
from chispa import assert_df_equality
from pyspark.sql import functions as F
from reference import DELETE, UPSERT, Change, fold_scd2
from users import (
    EXAMPLE,
    SCHEMA,
    SOLE_FIRST,
    SOLE_SECOND,
    VERSIONS,
    as_changes,
    assert_versions,
    history_flow,
    operations,
)

import autocdc
from autocdc.engine import bound, commit, fit, state


def test_worked_example_out_of_order_with_replay(spark, new_table):
    target = new_table("hist")
    flow = history_flow(target)
    late_first = sorted(EXAMPLE, key=lambda r: -r[4])
    flow.apply(spark.createDataFrame(late_first[:4], SCHEMA))
    second = flow.apply(spark.createDataFrame(late_first[4:], SCHEMA))
    replay = flow.apply(spark.createDataFrame(EXAMPLE, SCHEMA))
    assert_versions(
        spark,
        target,
        [
            (123, "Isabel", "Monterrey", 1, 5),
            (123, "Isabel", "Chihuahua", 5, 6),
            (124, "Raul", "Oaxaca", 1, None),
            (125, "Mercedes", "Tijuana", 2, 5),
            (125, "Mercedes", "Mexicali", 5, 6),
            (125, "Mercedes", "Guadalajara", 6, None),
            (126, "Lily", "Cancun", 2, None),
        ],
    )
    current = spark.createDataFrame(
        [(124, "Raul", "Oaxaca"), (125, "Mercedes", "Guadalajara"), (126, "Lily", "Cancun")],
        "userId int, name string, city string",
    )
    assert_df_equality(flow.current(spark), current, ignore_row_order=True, ignore_nullable=True)
    at_5 = spark.createDataFrame(
        [
            (123, "Isabel", "Chihuahua"),
            (124, "Raul", "Oaxaca"),
            (125, "Mercedes", "Mexicali"),
            (126, "Lily", "Cancun"),
        ],
        "userId int, name string, city string",
    )
    assert_df_equality(flow.as_of(spark, 5), at_5, ignore_row_order=True, ignore_nullable=True)
    assert (second.upserted, second.deleted) == (4, 0)
    assert (replay.upserted, replay.ignored_stale) == (0, 8)


def test_changes_repeated_within_a_batch_count_once(spark, new_table):
    """A change sent twice in one batch is one change: new, or stale when it was logged
    before; the two copies of a delete too, whatever payload each carries."""
    target = new_table("hist")
    flow = history_flow(target)
    flow.apply(spark.createDataFrame(EXAMPLE[:4], SCHEMA))
    logged, new = EXAMPLE[2], (124, "Raul", "Puebla", "UPDATE", 3)
    delete, other_payload = (126, None, None, "DELETE", 4), (126, "x", "y", "DELETE", 4)
    second = flow.apply(
        spark.createDataFrame([logged, logged, new, new, delete, other_payload], SCHEMA)
    )
    assert (second.duplicates_dropped, second.ignored_stale) == (3, 1)
    assert (second.upserted, second.deleted) == (1, 1)
    assert_versions(
        spark,
        target,
        [
            (123, "Isabel", "Monterrey", 1, None),
            (124, "Raul", "Oaxaca", 1, 3),
            (124, "Raul", "Puebla", 3, None),
            (125, "Mercedes", "Tijuana", 2, None),
            (126, "Lily", "Cancun", 2, 4),
        ],
    )


def test_worked_example_city_not_tracked(spark, new_table):
    target = new_table("hist")
    flow = history_flow(target, track_history_except_column_list=["city"])
    flow.apply(spark.createDataFrame(EXAMPLE, SCHEMA))
    assert_versions(
        spark,
        target,
        [
            (123, "Isabel", "Chihuahua", 1, 6),
            (124, "Raul", "Oaxaca", 1, None),
            (125, "Mercedes", "Guadalajara", 2, None),
            (126, "Lily", "Cancun", 2, None),
        ],
    )


def test_timestamp_sequence_gives_timestamp_bounds(spark, new_table):
    target = new_table("hist_ts")
    flow = autocdc.AutoCdcFlow(
        target=target,
        keys=["id"],
        sequence_by="ts",
        stored_as_scd_type=2,
        except_column_list=["ts"],
    )
    rows = [(1, "b", "2026-01-02 00:00:00"), (1, "a", "2026-01-01 00:00:00")]
    df = spark.createDataFrame(rows, "id int, v string, ts string").withColumn(
        "ts", F.to_timestamp("ts")
    )
    flow.apply(df)
    expected = spark.createDataFrame(
        [
            (1, "a", "2026-01-01 00:00:00", "2026-01-02 00:00:00"),
            (1, "b", "2026-01-02 00:00:00", None),
        ],
        "id int, v string, s string, e string",
    ).select(
        "id", "v", F.to_timestamp("s").alias("__START_AT"), F.to_timestamp("e").alias("__END_AT")
    )
    assert_df_equality(spark.table(target), expected, ignore_row_order=True, ignore_nullable=True)


def test_struct_sequence_bounds_are_structs(spark, new_table):
    target = new_table("hist_struct")
    flow = autocdc.AutoCdcFlow(
        target=target,
        keys=["id"],
        sequence_by=["day", "n"],
        stored_as_scd_type=2,
        except_column_list=["day", "n"],
    )
    rows = [(1, "b", 2, 0), (1, "a", 1, 9), (1, "c", 2, 1)]
    flow.apply(spark.createDataFrame(rows, "id int, v string, day int, n int"))
    got = {
        (r.v, tuple(r["__START_AT"]), r["__END_AT"] and tuple(r["__END_AT"]))
        for r in spark.table(target).collect()
    }
    assert got == {("a", (1, 9), (2, 0)), ("b", (2, 0), (2, 1)), ("c", (2, 1), None)}


def test_a_first_batch_of_one_change_per_key_opens_histories_as_the_fold_says(
    spark, new_table, sole_batches
):
    """The first batch (nothing logged, no key twice) is not spread by key; the next one,
    a tie, a replay, late and dead changes and an untracked column among them, finds its
    log as ever."""
    target = new_table("hist_sole")
    flow = history_flow(target, track_history_except_column_list=["city"])
    for rows in (SOLE_FIRST, SOLE_SECOND):
        flow.apply(spark.createDataFrame(rows, SCHEMA))
    assert sole_batches == [True, False]
    assert operations(spark, target) == ["WRITE", "MERGE"]  # into the empty target: appended
    expected = fold_scd2(as_changes(SOLE_FIRST + SOLE_SECOND), tracked=[0])
    assert_versions(spark, target, [(k, *v, s, e) for k, v, s, e in expected])


def test_a_first_batch_into_a_target_that_holds_versions_is_merged_not_appended(spark, new_table):
    """A flow adopting a table that has versions: its first batch MERGEs (key 1's version
    at the same start is rewritten, not added twice; key 7, not in the batch, stays)."""
    target = new_table("hist_adopted")
    held = [(1, "old", "y", 10, None), (7, "g", "z", 1, None)]
    spark.createDataFrame(held, VERSIONS).write.format("delta").saveAsTable(target)
    history_flow(target).apply(spark.createDataFrame(SOLE_FIRST, SCHEMA))
    assert operations(spark, target)[-1] == "MERGE"
    expected = fold_scd2(as_changes(SOLE_FIRST), tracked=[0, 1])
    assert_versions(spark, target, [(k, *v, s, e) for k, v, s, e in expected] + [held[1]])


MIXED_TRACKING = {"city_untracked": ["city"], "all_tracked": None}


@pytest.mark.parametrize("listed", [True, False], ids=["keys_listed", "keys_ranged"])
@pytest.mark.parametrize("untracked", MIXED_TRACKING.values(), ids=MIXED_TRACKING.keys())
def test_keys_that_continue_and_keys_rebuilt_in_one_batch_match_the_fold(
    spark, new_table, untracked, listed, monkeypatch
):
    """Most keys take one change after all they logged and only continue their history
    (close, update in place, open); late keys, keys changed twice and keys whose last
    logged sequence holds a tie are rebuilt. Both kinds in one batch, then a replay and a
    further batch; with every column tracked the log keeps hashes, not values. Bounded by
    the keys' values (a small batch), and by their range (a large one, whose MERGE
    source is broadcast)."""
    if not listed:
        monkeypatch.setattr(bound, "MAX_IN_LIST", 0)
    monkeypatch.setattr(commit, "FOLD_EVERY", 1)  # the state table holds every batch
    target = new_table("hist_mixed")
    flow = history_flow(target, track_history_except_column_list=untracked)
    first = [(k, f"n{k}", "c", "INSERT", 10) for k in range(1, 9)]
    first += [(7, None, None, "DELETE", 20), (8, None, None, "DELETE", 20)]
    # Ties at the last logged sequence ("b" wins): 11 continues, 12 takes a late change.
    first += [(k, n, "c", "INSERT", 10) for k in (11, 12) for n in ("a", "b")]
    second = [
        (1, "n1b", "c", "UPDATE", 30),  # tracked value: closes and opens
        (2, "n2", "moved", "UPDATE", 30),  # untracked value: in place
        (3, "n3", "c", "UPDATE", 30),  # the same values: nothing to write
        (4, None, None, "DELETE", 30),  # closes
        (7, None, None, "DELETE", 30),  # already gone: nothing
        (8, "n8b", "c", "UPDATE", 30),  # back to life: opens
        (9, "n9", "c", "INSERT", 30),  # new key
        (5, "n5-early", "c", "INSERT", 5),  # late: rebuilt
        (6, "n6b", "c", "UPDATE", 30),  # two changes: rebuilt
        (6, "n6c", "x", "UPDATE", 40),
        (10, "n10", "c", "INSERT", 30),  # new key, inserted and deleted: rebuilt
        (10, None, None, "DELETE", 40),
        (11, "a", "c", "UPDATE", 30),  # the tie's loser, later: closes and opens
        (12, "a", "x", "UPDATE", 5),  # late, before the tie
    ]
    third = [(1, "n1c", "c", "UPDATE", 50), (2, None, None, "DELETE", 50)]
    for rows in (first, second, second, third):
        flow.apply(spark.createDataFrame(rows, SCHEMA))

    changes = [
        Change(k, s, DELETE if op == "DELETE" else UPSERT, () if op == "DELETE" else (n, c))
        for k, n, c, op, s in first + second + third
    ]
    tracked = [0] if untracked else [0, 1]
    expected = [(k, *v, s, e) for k, v, s, e in fold_scd2(changes, tracked=tracked)]
    assert_versions(spark, target, expected)
    logged = spark.table(flow.state_table).where("__autocdc_kind = 'E' AND __autocdc_live")
    kept = logged.select(
        F.count(F.when(F.col("name").isNotNull(), 1)), F.count("__autocdc_hash")
    ).first()
    upserts = len({c for c in changes if c.op == UPSERT})
    assert tuple(kept) == ((upserts, 0) if untracked else (0, upserts))


def _hot_key_changes(first: int, count: int) -> list[tuple]:
    """``count`` changes of key 1 from sequence ``first * 10`` on: new names (tracked) every
    third change, a new city (untracked in one mode) every change, a delete now and then."""
    return [
        (1, None, None, "DELETE", s * 10)
        if s % 37 == 0
        else (1, f"n{s // 3}", f"c{s % 4}", "UPDATE", s * 10)
        for s in range(first, first + count)
    ]


@pytest.mark.parametrize("untracked", MIXED_TRACKING.values(), ids=MIXED_TRACKING.keys())
def test_a_hot_key_with_many_versions_per_batch_matches_the_fold(
    spark, new_table, untracked, monkeypatch
):
    """One key with 200 changes in one batch (new versions, updates in place, deletes and
    reinserts), then 100 more after all it logged (its history continues from its last
    logged change), replayed, then late changes among them (its history is rebuilt);
    another key beside it takes one or two changes a batch."""
    monkeypatch.setattr(commit, "FOLD_EVERY", 2)  # a pending state and a folded one
    target = new_table("hist_hot")
    flow = history_flow(target, track_history_except_column_list=untracked)
    first = [*_hot_key_changes(1, 200), (2, "b", "x", "INSERT", 15), (2, "b", "y", "UPDATE", 25)]
    second = [*_hot_key_changes(201, 100), (2, "b3", "y", "UPDATE", 2005)]
    late = [
        (1, "late", "c0", "UPDATE", 555),
        (1, None, None, "DELETE", 1505),
        (2, "b1", "x", "UPDATE", 20),
    ]
    for rows in (first, second, second, late):
        flow.apply(spark.createDataFrame(rows, SCHEMA))
    tracked = [0] if untracked else [0, 1]
    expected = fold_scd2(as_changes(first + second + late), tracked=tracked)
    assert_versions(spark, target, [(k, *v, s, e) for k, v, s, e in expected])


def test_a_log_of_values_written_before_hashes_keeps_working(spark, new_table, monkeypatch):
    """A target whose state table has no log property (written before hashes were
    logged) goes on logging values, and its history stays the fold's."""
    target = new_table("hist_values_log")
    flow = history_flow(target)
    without = fit.definition

    def older(spec, sequence):
        return {k: v for k, v in without(spec, sequence).items() if k != state.PROP_LOG}

    monkeypatch.setattr(fit, "definition", older)
    late_first = sorted(EXAMPLE, key=lambda r: -r[4])
    flow.apply(spark.createDataFrame(late_first[:4], SCHEMA))
    monkeypatch.undo()
    monkeypatch.setattr(commit, "FOLD_EVERY", 1)  # the state table holds every batch
    flow.apply(spark.createDataFrame(late_first[4:], SCHEMA))
    flow.apply(spark.createDataFrame(EXAMPLE, SCHEMA))
    expected = fold_scd2(as_changes(EXAMPLE), tracked=[0, 1])
    assert_versions(spark, target, [(k, *v, s, e) for k, v, s, e in expected])
    logged = spark.table(flow.state_table).where("__autocdc_kind = 'E' AND __autocdc_live")
    assert logged.where("name IS NULL").count() == 0
    assert logged.count() == sum(1 for r in EXAMPLE if r[3] != "DELETE")


def test_a_track_history_list_into_a_target_logging_hashes_is_refused(spark, new_table):
    """Its log keeps no untracked values to split versions with: a full refresh rebuilds
    it under the new list."""
    target = new_table("hist_hashes")
    history_flow(target).apply(spark.createDataFrame(EXAMPLE[:4], SCHEMA))
    narrower = history_flow(target, track_history_except_column_list=["city"])
    with pytest.raises(autocdc.DefinitionChangedError, match="track_history list"):
        narrower.apply(spark.createDataFrame(EXAMPLE[4:], SCHEMA))
