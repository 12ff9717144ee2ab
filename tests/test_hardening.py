"""Real-table shapes that once lost data, depended on arrival order or jammed a flow."""

from __future__ import annotations

import os
import time

import pytest
from chispa import assert_df_equality
from pyspark.sql import functions as F
from test_scd1 import EXAMPLE, EXPECTED, SCHEMA, assert_target, users_flow
from test_scd2 import assert_versions, history_flow

import autocdc
from autocdc.engine import tables
from autocdc.engine.errors import QUARANTINE_NULL_SEQUENCE


def test_collect_tombstones_keeps_scd2_history(spark, new_table):
    target = new_table("hist_gc")
    flow = history_flow(target, tombstone_retention_days=0)
    flow.apply(spark.createDataFrame([(1, "a", "X", "INSERT", 1)], SCHEMA))
    assert flow.collect_tombstones(spark) == 0
    flow.apply(spark.createDataFrame([(1, "b", "X", "UPDATE", 2)], SCHEMA))
    flow.apply(spark.createDataFrame([(1, None, None, "DELETE", 3)], SCHEMA))
    flow.collect_tombstones(spark)
    flow.apply(spark.createDataFrame([(1, "c", "X", "UPDATE", 4)], SCHEMA))
    assert_versions(
        spark,
        target,
        [(1, "a", "X", 1, 2), (1, "b", "X", 2, 3), (1, "c", "X", 4, None)],
    )


@pytest.mark.parametrize("scd_type", [1, 2])
def test_ties_compare_in_the_declared_column_order(spark, new_table, scd_type):
    """Declared order (by name: city, name): ("A", "z") beats ("B", "a"), whichever batch
    lists its columns the other way round and whichever arrives first."""
    x, y = (1, "B", "a", "UPDATE", 5), (1, "A", "z", "UPDATE", 5)
    swapped = "userId int, city string, name string, operation string, sequenceNum long"
    make = users_flow if scd_type == 1 else history_flow
    for first, second in [(x, y), (y, x)]:
        target = new_table("tie_order")
        flow = make(target)
        flow.apply(spark.createDataFrame([first], SCHEMA))
        flow.apply(spark.createDataFrame([(1, second[2], second[1], *second[3:])], swapped))
        got = flow.current(spark).select("userId", "name", "city")
        assert_df_equality(
            got,
            spark.createDataFrame([(1, "A", "z")], "userId int, name string, city string"),
            ignore_nullable=True,
        )
        assert spark.table(target).columns[:3] == ["userId", "name", "city"]


def test_half_created_table_does_not_brick_the_warehouse(spark, new_table, warehouse):
    """A kill inside table creation leaves `_delta_log` without commit 0."""
    target = new_table("half")
    for name in (target, f"{target}__autocdc_state"):
        (warehouse / name / "_delta_log").mkdir(parents=True)
    (warehouse / target / "_delta_log" / ".00000000000000000000.json.tmp").write_text("{")
    killed_long_ago = time.time() - 3600  # a younger folder may be a creation in progress
    for name in (target, f"{target}__autocdc_state"):
        os.utime(warehouse / name, (killed_long_ago, killed_long_ago))
    registered = tables.register_warehouse_tables(spark)  # what every session start runs
    assert target not in registered
    users_flow(target).apply(spark.createDataFrame(EXAMPLE, SCHEMA))
    assert_target(spark, target, EXPECTED)
    assert target in tables.register_warehouse_tables(spark)


AWKWARD = (
    "id int, live string, `exists` string, x string, x_ver string, `a.b` string, "
    "`we``ird` string, `sp ace` string, m map<string,int>, op string, seq long"
)


@pytest.mark.parametrize(
    "mode",
    [
        {"stored_as_scd_type": 1},
        {"stored_as_scd_type": 1, "ignore_null_updates": True},
        {"stored_as_scd_type": 2},
        {"stored_as_scd_type": 2, "track_history_except_column_list": ["m"]},
    ],
    ids=["scd1", "scd1-ignore-null", "scd2", "scd2-untracked-map"],
)
def test_awkward_column_names_and_maps(spark, new_table, mode):
    target = new_table("awkward")
    flow = autocdc.AutoCdcFlow(
        target=target,
        keys=["id"],
        sequence_by="seq",
        apply_as_deletes="op = 'D'",
        except_column_list=["op", "seq"],
        **mode,
    )
    values = ("l", "e", "x", "v", "d", "w", "s", {"k": 1})
    late = ("L", None, "X", None, "D", "W", None, {"k": 2})
    flow.apply(spark.createDataFrame([(1, *values, "U", 2), (2, *values, "U", 1)], AWKWARD))
    flow.apply(spark.createDataFrame([(1, *late, "U", 3), (2, *late, "D", 2)], AWKWARD))
    flow.apply(spark.createDataFrame([(1, *late, "U", 3), (1, *values, "U", 1)], AWKWARD))
    got = [tuple(r) for r in flow.current(spark).drop("m").collect()]
    if mode.get("ignore_null_updates"):
        expected = [(1, "L", "e", "X", "v", "D", "W", "s")]
    else:
        expected = [(1, "L", None, "X", None, "D", "W", None)]
    assert got == expected
    assert [r.m for r in flow.current(spark).collect()] == [{"k": 2}]
    if mode["stored_as_scd_type"] == 2:
        assert spark.table(target).count() == 3  # 1: two versions; 2: one, ended


def test_null_field_of_a_struct_sequence_is_quarantined(spark, new_table):
    target = new_table("null_seq")
    flow = autocdc.AutoCdcFlow(
        target=target, keys=["id"], sequence_by=["day", "n"], except_column_list=["day", "n"]
    )
    rows = [(1, "a", 1, 1), (1, "b", 1, None), (2, "c", None, 5)]
    metrics = flow.apply(spark.createDataFrame(rows, "id int, v string, day int, n int"))
    assert_target(spark, target, [(1, "a")], "id int, v string")
    assert metrics.quarantined == 2
    reasons = {r.reason for r in spark.table(flow.quarantine_table).collect()}
    assert reasons == {QUARANTINE_NULL_SEQUENCE}


def test_debezium_event_without_source_block_is_quarantined(spark, new_table):
    target = new_table("dbz")
    flow = autocdc.AutoCdcFlow(
        target=target,
        keys=["id"],
        sequence_by=autocdc.debezium_sequence("postgresql"),
        except_column_list=["source"],
    )
    schema = "id int, v string, source struct<lsn: long>"
    metrics = flow.apply(spark.createDataFrame([(1, "a", (7,)), (2, "b", None)], schema))
    assert metrics.quarantined == 1
    assert_target(spark, target, [(1, "a")], "id int, v string")


@pytest.fixture
def new_york():
    """The driver's local time zone has daylight saving (the JVM session stays UTC)."""
    before = os.environ.get("TZ")
    os.environ["TZ"] = "America/New_York"
    time.tzset()
    yield
    if before is None:
        os.environ.pop("TZ")
    else:
        os.environ["TZ"] = before
    time.tzset()


def test_timestamp_horizons_survive_a_dst_driver(spark, new_table, new_york):
    """01:30 happens twice in New York on 2026-11-01 (05:30 and 06:30 UTC)."""
    target = new_table("dst")
    flow = autocdc.AutoCdcFlow(
        target=target,
        keys=["id"],
        sequence_by="ts",
        apply_as_truncates="op = 'T'",
        except_column_list=["op", "ts"],
    )

    def batch(rows):
        df = spark.createDataFrame(rows, "id int, v string, op string, ts string")
        return df.withColumn("ts", F.to_timestamp("ts"))  # parsed in the session's UTC

    flow.apply(batch([(1, "a", "U", "2026-11-01 05:00:00")]))
    flow.apply(batch([(None, None, "T", "2026-11-01 06:30:00")]))
    # Below the truncate (06:30 UTC): dead, even if it comes later or for a new key.
    flow.apply(batch([(2, "late", "U", "2026-11-01 06:00:00")]))
    flow.apply(batch([(3, "after", "U", "2026-11-01 06:45:00")]))
    assert_target(spark, target, [(3, "after")], "id int, v string")
    horizon = (
        spark.table(flow.state_table)
        .where("__autocdc_kind = 'M'")
        .orderBy(F.col("__autocdc_batch").desc())
        .select(F.date_format("__autocdc_del", "yyyy-MM-dd HH:mm:ss").alias("h"))
        .first()
        .h
    )
    assert horizon == "2026-11-01 06:30:00"


@pytest.mark.parametrize(
    ("change", "field", "live"),
    [
        ({"keys": ["userId", "name"]}, "keys", 4),  # (123, NULL) is quarantined
        ({"sequence_by": "cast(sequenceNum as int)"}, "sequence type", 3),
        ({"stored_as_scd_type": 2}, "stored_as_scd_type", 3),
    ],
)
def test_definition_drift_is_refused(spark, new_table, change, field, live):
    target = new_table("drift")
    users_flow(target).apply(spark.createDataFrame(EXAMPLE, SCHEMA))
    changed = users_flow(target, **change)
    with pytest.raises(autocdc.DefinitionChangedError) as err:
        changed.apply(spark.createDataFrame(EXAMPLE, SCHEMA))
    assert err.value.params["field"] == field
    changed.full_refresh(spark)
    changed.apply(spark.createDataFrame(EXAMPLE, SCHEMA))
    assert changed.current(spark).count() == live


def test_a_partial_flow_needs_a_partial_target(spark, new_table):
    """A target created for full rows keeps no per-column sequences: a flow with partial
    upserts is refused, and works after a full refresh; a full-row flow into the partial
    target is then applied as one (its NULLs set the columns to NULL)."""
    target = new_table("not_partial")
    users_flow(target).apply(spark.createDataFrame(EXAMPLE, SCHEMA))
    partial = users_flow(target, ignore_null_updates=True)
    with pytest.raises(autocdc.TargetNotPartialError) as err:
        partial.apply(spark.createDataFrame(EXAMPLE, SCHEMA))
    assert err.value.params == {
        "flow": target,
        "target": target,
        "why": "ignore_null_updates",
        "remedy": "flow.full_refresh(spark)",
    }
    partial.full_refresh(spark)
    partial.apply(spark.createDataFrame([*EXAMPLE, (124, None, "Puebla", "UPDATE", 7)], SCHEMA))
    assert_target(spark, target, [(124, "Raul", "Puebla"), *EXPECTED[1:]])
    users_flow(target).apply(spark.createDataFrame([(124, None, "Leon", "UPDATE", 8)], SCHEMA))
    assert_target(spark, target, [(124, None, "Leon"), *EXPECTED[1:]])


def test_a_key_the_feed_lacks_is_an_unknown_column_not_a_changed_definition(spark, new_table):
    """After the first apply, a misspelled key is still a typo to fix (as on a fresh
    target), not a definition change that asks for a full refresh."""
    target = new_table("drift_typo")
    users_flow(target).apply(spark.createDataFrame(EXAMPLE, SCHEMA))
    with pytest.raises(autocdc.UnknownColumnError) as err:
        users_flow(target, keys=["userid_typo"]).apply(spark.createDataFrame(EXAMPLE, SCHEMA))
    assert (err.value.params["field"], err.value.params["columns"]) == ("keys", ["userid_typo"])


@pytest.mark.parametrize(
    ("column", "error"),
    [
        ("cast(userId as double)", autocdc.InvalidKeyTypeError),
        ("map('k', userId)", autocdc.InvalidKeyTypeError),
    ],
)
def test_unreliable_key_types_are_refused(spark, new_table, column, error):
    target = new_table("badkey")
    df = spark.createDataFrame(EXAMPLE, SCHEMA).withColumn("userId", F.expr(column))
    with pytest.raises(error):
        users_flow(target).apply(df)
    assert not spark.catalog.tableExists(target)


@pytest.mark.parametrize("field", ["sequence_by", "apply_as_deletes"])
def test_nondeterministic_expressions_are_refused(spark, new_table, field):
    target = new_table("nondet")
    expr = {"sequence_by": "sequenceNum + rand()", "apply_as_deletes": "rand() > 0.5"}[field]
    with pytest.raises(autocdc.NondeterministicExpressionError) as err:
        users_flow(target, **{field: expr}).apply(spark.createDataFrame(EXAMPLE, SCHEMA))
    assert err.value.params["field"] == field
    assert not spark.catalog.tableExists(target)


def test_replay_of_a_recreated_key_is_stale_not_late(spark, new_table):
    target = new_table("recreated")
    flow = users_flow(target, tombstone_retention_days=0)
    insert, delete = (1, "A", "X", "INSERT", 1), (1, None, None, "DELETE", 5)
    flow.apply(spark.createDataFrame([insert], SCHEMA))
    flow.apply(spark.createDataFrame([delete], SCHEMA))
    assert flow.collect_tombstones(spark) == 1
    flow.apply(spark.createDataFrame([(1, "A", "new", "INSERT", 6)], SCHEMA))
    replay = flow.apply(spark.createDataFrame([insert, delete], SCHEMA))
    assert (replay.quarantined, replay.ignored_stale) == (0, 2)
    assert_target(spark, target, [(1, "A", "new")])


def test_schema_evolution_scd1(spark, new_table):
    target = new_table("evolve")
    flow = users_flow(target, ignore_null_updates=True)
    flow.apply(spark.createDataFrame([(1, "Ann", "Rome", "INSERT", 1)], SCHEMA))
    # A new nullable column, the key widened to bigint, `city` left out.
    wider = "userId long, name string, zip string, operation string, sequenceNum long"
    flow.apply(spark.createDataFrame([(2, "Bob", "Z2", "INSERT", 2)], wider))
    flow.apply(spark.createDataFrame([(1, "Anne", "Z1", "UPDATE", 3)], wider))
    schema = "userId long, name string, city string, zip string"
    assert_target(spark, target, [(1, "Anne", "Rome", "Z1"), (2, "Bob", None, "Z2")], schema)
    retyped = "userId long, name int, operation string, sequenceNum long"
    with pytest.raises(autocdc.SchemaMismatchError) as err:
        flow.apply(spark.createDataFrame([(3, 7, "INSERT", 4)], retyped))
    assert err.value.params["changed"] == ["name: string -> int"]
    assert_target(spark, target, [(1, "Anne", "Rome", "Z1"), (2, "Bob", None, "Z2")], schema)


def test_schema_evolution_scd2(spark, new_table):
    target = new_table("evolve2")
    flow = history_flow(target)
    flow.apply(spark.createDataFrame([(1, "Ann", "Rome", "INSERT", 1)], SCHEMA))
    wider = "userId int, zip string, name string, operation string, sequenceNum long"
    flow.apply(spark.createDataFrame([(1, "Z1", "Ann", "UPDATE", 2)], wider))
    columns = ["userId", "name", "city", "zip", "__START_AT", "__END_AT"]
    assert spark.table(target).columns == columns
    assert_df_equality(
        spark.table(target),
        spark.createDataFrame(
            [(1, "Ann", "Rome", None, 1, 2), (1, "Ann", None, "Z1", 2, None)],
            "userId int, name string, city string, zip string, __START_AT long, __END_AT long",
        ),
        ignore_row_order=True,
        ignore_nullable=True,
    )


def test_column_list_decides_about_new_columns(spark, new_table):
    target = new_table("evolve_list")
    flow = users_flow(target, except_column_list=None, column_list=["name", "userId"])
    flow.apply(spark.createDataFrame([(1, "Ann", "Rome", "INSERT", 1)], SCHEMA))
    wider = "userId int, zip string, name string, operation string, sequenceNum long"
    flow.apply(spark.createDataFrame([(2, "Z1", "Bob", "INSERT", 2)], wider))
    assert_target(spark, target, [("Ann", 1), ("Bob", 2)], "name string, userId int")
