"""SCD type 2: the documented examples, out-of-order splits, and the reference fold."""

from __future__ import annotations

import itertools

from chispa import assert_df_equality
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import functions as F
from reference import DELETE, UPSERT, Change, fold_scd2
from test_scd1 import EXAMPLE, SCHEMA

import autocdc

PROP_SCHEMA = "id int, a string, b int, op string, seq long"
VERSIONS = "userId int, name string, city string, __START_AT long, __END_AT long"
_targets = itertools.count()


def to_rows(batch: list[Change]) -> list[tuple]:
    return [(c.key, *(c.values or (None, None)), c.op, c.seq) for c in batch]


def history_flow(target, **overrides):
    spec = {
        "target": target,
        "keys": ["userId"],
        "sequence_by": "sequenceNum",
        "apply_as_deletes": "operation = 'DELETE'",
        "except_column_list": ["operation", "sequenceNum"],
        "stored_as_scd_type": 2,
    }
    return autocdc.AutoCdcFlow(**{**spec, **overrides})


def assert_versions(spark, target, rows):
    expected = spark.createDataFrame(rows, VERSIONS)
    assert_df_equality(spark.table(target), expected, ignore_row_order=True, ignore_nullable=True)


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


changes = st.builds(
    Change,
    key=st.integers(1, 2),
    seq=st.integers(1, 6),
    op=st.sampled_from([UPSERT, UPSERT, UPSERT, DELETE]),
    values=st.tuples(st.sampled_from([None, "x", "y"]), st.sampled_from([None, 1, 2])),
)


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    chosen=st.lists(changes, min_size=1, max_size=9),
    data=st.data(),
    track=st.sampled_from([None, ["a"], ["b"]]),
    ignore_null_updates=st.booleans(),
)
def test_history_matches_reference_fold(spark, chosen, data, track, ignore_null_updates):
    order = data.draw(st.permutations(chosen))
    cut = data.draw(st.integers(0, len(order)))
    batches = [b for b in (order[:cut], order[cut:]) if b]
    batches.append(data.draw(st.sampled_from(batches)))  # one batch applied twice
    target = f"hist_prop_{next(_targets)}"
    flow = autocdc.AutoCdcFlow(
        target=target,
        keys=["id"],
        sequence_by="seq",
        apply_as_deletes="op = 'D'",
        except_column_list=["op", "seq"],
        stored_as_scd_type=2,
        track_history_column_list=track,
        ignore_null_updates=ignore_null_updates,
    )
    for batch in batches:
        flow.apply(spark.createDataFrame(to_rows(batch), PROP_SCHEMA))
    got = {
        (r.id, (r.a, r.b), r["__START_AT"], r["__END_AT"]) for r in spark.table(target).collect()
    }
    tracked = None if track is None else [{"a": 0, "b": 1}[c] for c in track]
    assert got == fold_scd2(chosen, tracked, ignore_null_updates), batches


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
