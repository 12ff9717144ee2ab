"""Real-table shapes that once lost data, depended on arrival order or jammed a flow."""

from __future__ import annotations

import json
import os
import time

import pytest
from chispa import assert_df_equality
from projects import run, write_project
from pyspark.sql import functions as F
from users import (
    EXAMPLE,
    EXPECTED,
    SCHEMA,
    assert_target,
    assert_versions,
    history_flow,
    users_flow,
)

import autocdc
from autocdc.engine import commit, tables
from autocdc.engine.errors import QUARANTINE_NULL_SEQUENCE
from autocdc.runtime.warehouse import register_warehouse_tables


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


def test_ties_compare_in_the_declared_column_order_in_history(spark, new_table):
    """SCD2: declared order (by name: city, name): ("A", "z") beats ("B", "a"), whichever
    batch lists its columns the other way round and whichever arrives first (SCD1's:
    test_scd1.py's test_ties_compare_in_the_declared_order_whatever_the_batch_order)."""
    x, y = (1, "B", "a", "UPDATE", 5), (1, "A", "z", "UPDATE", 5)
    swapped = "userId int, city string, name string, operation string, sequenceNum long"
    for first, second in [(x, y), (y, x)]:
        target = new_table("tie_order")
        flow = history_flow(target)
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
    registered = register_warehouse_tables(spark)  # what every session start runs
    assert target not in registered
    users_flow(target).apply(spark.createDataFrame(EXAMPLE, SCHEMA))
    assert_target(spark, target, EXPECTED)
    assert target in register_warehouse_tables(spark)


@pytest.mark.parametrize("attempt", range(3))
def test_a_table_creation_killed_just_now_is_cleared_not_taken_for_another_writer(
    spark, new_table, warehouse, monkeypatch, attempt
):
    """A kill inside Delta's table creation leaves `_delta_log/_staged_commits` and no
    commit 0, in the target's and the state's folders. Applied again at once (younger than
    the creation grace, as a fast restart is), the batch waits the grace out and creates
    the tables, rather than counting lost races until it reports another writer."""
    monkeypatch.setattr(tables, "CREATION_GRACE_SECONDS", 1.0)
    target = new_table("half_now")
    for name in (target, f"{target}__autocdc_state"):
        (warehouse / name / "_delta_log" / "_staged_commits").mkdir(parents=True)
    users_flow(target).apply(spark.createDataFrame(EXAMPLE, SCHEMA))
    assert_target(spark, target, EXPECTED)


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


# Names that are SQL in themselves (a backtick, a dot, a space), as keys, values, the
# operation and the sequence (a struct of two such columns in one mode).
TICKED = "`k``ey` int, `q``r` string, `a.b c` string, `o``p` string, `d``ay` int, `s``eq` long"
TICKED_SNAPSHOT = "`k``ey` int, `q``r` string, `a.b c` string"
TICKED_OPTIONS = {
    "keys": ["k`ey"],
    "sequence_by": "`s``eq`",
    "apply_as_deletes": "`o``p` = 'D'",
    "except_column_list": ["o`p", "d`ay", "s`eq"],
}
# (key, q`r, a.b c, op, seq): a tie at sequence 2 across batches, an out-of-order
# upsert, a delete, and an upsert below that delete.
TICKED_BATCHES = [
    [(1, "a", "x", "U", 1), (2, "b", "y", "U", 1), (3, "c", "z", "U", 1)],
    [(1, "B", None, "U", 2), (2, "b0", "y0", "U", 0), (3, None, None, "D", 2)],
    [
        (1, "A", "v", "U", 2),
        (2, "b2", "y2", "U", 3),
        (2, "b2", "y3", "U", 4),
        (3, "c", "z", "U", 1),
    ],
]
TICKED_HISTORY = [
    (1, "a", "x", 1, 2),
    (2, "b0", "y0", 0, 1),
    (2, "b", "y", 1, 3),
    (3, "c", "z", 1, 2),
]
TICKED_MODES = {
    # Ties compare (a.b c, q`r), NULL lowest: ("v", "A") beats (NULL, "B"). Key 3's delete
    # collected, an upsert at or below it is late (quarantined).
    "scd1": (
        [{"tombstone_retention_days": 0}],
        ["collect", [(3, "c", "z", "U", 2)]],
        [(1, "A", "v"), (2, "b2", "y3")],
    ),
    # Per column: q`r's tie keeps the greater "B"; the NULL does not set a.b c.
    "scd1-ignore-null": (
        [{"ignore_null_updates": True}],
        [],
        [(1, "B", "v"), (2, "b2", "y3")],
    ),
    "scd1-groups": (
        [
            {
                "name": f"g{g}",
                "sequence_groups": {"one": ["q`r"], "two": ["a.b c"]},
                "sequence_group": g,
            }
            for g in ("one", "two")
        ],
        [],
        [(1, "B", "v"), (2, "b2", "y3")],
    ),
    # The truncate at (1, 3) removes key 1 (at 2) and leaves key 2 (at 4).
    "scd1-struct-sequence-truncate": (
        [{"sequence_by": ["d`ay", "s`eq"], "apply_as_truncates": "`o``p` = 'T'"}],
        [[(None, None, None, "T", 3)]],
        [(2, "b2", "y3")],
    ),
    "scd2": (
        [{"stored_as_scd_type": 2}],
        [],
        [*TICKED_HISTORY, (1, "A", "v", 2, None), (2, "b2", "y2", 3, 4), (2, "b2", "y3", 4, None)],
    ),
    # a.b c alone changes at 4: no new version. (Its except-list twin resolves to the same
    # tracked list before any SQL is built: test_awkward_column_names_and_maps has one.)
    "scd2-tracked": (
        [{"stored_as_scd_type": 2, "track_history_column_list": ["q`r"]}],
        [],
        [*TICKED_HISTORY, (1, "A", "v", 2, None), (2, "b2", "y3", 3, None)],
    ),
}
# TICKED_OPTIONS and TICKED's columns in a pipeline (a CDC flow's target is resolved first).
TICKED_PIPELINE = """
from pyspark import pipelines as dp

@dp.temporary_view
def changes():
    return spark.readStream.schema("SCHEMA").json("{data}")

dp.create_streaming_table("ticked")
dp.create_auto_cdc_flow(
    target="ticked", source="changes", keys=["k`ey"], sequence_by="`s``eq`",
    apply_as_deletes="`o``p` = 'D'", except_column_list=["o`p", "d`ay", "s`eq"],
)
""".replace("SCHEMA", TICKED)
TICKED_SNAPSHOTS = [
    [(1, "a", "x"), (2, "b", "y"), (3, "c", "z")],
    [(1, "A", "v"), (2, "b", "y2")],
    [(1, "A", "v"), (2, "b", "y3"), (3, "c", "z")],
]


@pytest.mark.parametrize(
    "mode", [*TICKED_MODES, "snapshot-scd1", "snapshot-scd2-tracked", "pipeline-scd1"]
)
def test_names_with_backticks_dots_and_spaces_in_every_mode(spark, new_table, tmp_path, mode):
    """Issue 32: a backtick in a name failed some modes' first apply with Spark's
    INVALID_ATTRIBUTE_NAME_SYNTAX; every name is quoted wherever the engine builds SQL."""
    target = new_table("ticked")
    if mode.startswith("snapshot"):
        scd2 = mode.endswith("tracked")
        snapshot_flow = autocdc.AutoCdcSnapshotFlow(
            target=target,
            keys=["k`ey"],
            stored_as_scd_type=2 if scd2 else 1,
            track_history_column_list=["q`r"] if scd2 else None,
        )
        for version, rows in enumerate(TICKED_SNAPSHOTS, start=1):
            snapshot_flow.apply(spark.createDataFrame(rows, TICKED_SNAPSHOT), version)
        expected = TICKED_SNAPSHOTS[-1]
        if scd2:
            expected = [
                (1, "a", "x", 1, 2),
                (1, "A", "v", 2, None),
                (2, "b", "y3", 1, None),
                (3, "c", "z", 1, 2),
                (3, "c", "z", 3, None),
            ]
    elif mode == "pipeline-scd1":
        spec = write_project(tmp_path, target, {"ticked.py": TICKED_PIPELINE})
        (tmp_path / "data").mkdir()
        names = [f.name for f in spark.createDataFrame([], TICKED).schema.fields]
        for i, batch in enumerate(TICKED_BATCHES):
            lines = [json.dumps(dict(zip(names, (*r[:4], 1, r[4]), strict=True))) for r in batch]
            (tmp_path / "data" / f"{i}.json").write_text("\n".join(lines))
            run(spark, spec)
        target = f"{target}.ticked"
        expected = TICKED_MODES["scd1"][2]
    else:
        declared, extra, expected = TICKED_MODES[mode]
        flows = [autocdc.AutoCdcFlow(target=target, **{**TICKED_OPTIONS, **f}) for f in declared]
        for batch in [*TICKED_BATCHES, *extra]:
            for flow in flows:
                if batch == "collect":
                    flow.collect_tombstones(spark)
                else:
                    flow.apply(spark.createDataFrame([(*r[:4], 1, r[4]) for r in batch], TICKED))
    assert sorted(map(tuple, spark.table(target).collect()), key=repr) == sorted(expected, key=repr)


def test_a_struct_sequence_orders_by_its_fields_and_a_null_field_is_quarantined(spark, new_table):
    """Key 3: (day, n) compares day first, then n; a NULL in any field is quarantined."""
    target = new_table("null_seq")
    flow = autocdc.AutoCdcFlow(
        target=target, keys=["id"], sequence_by=["day", "n"], except_column_list=["day", "n"]
    )
    rows = [(1, "a", "2026-01-01", 1), (1, "b", "2026-01-01", None), (2, "c", None, 5)]
    rows += [(3, "b", "2026-01-02", 0), (3, "a", "2026-01-01", 9), (3, "c", "2026-01-02", 1)]
    df = spark.createDataFrame(rows, "id int, v string, day string, n int")
    metrics = flow.apply(df.withColumn("day", F.to_date("day")))
    assert_target(spark, target, [(1, "a"), (3, "c")], "id int, v string")
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


def test_timestamp_horizons_survive_a_dst_driver(spark, new_table, new_york, monkeypatch):
    """01:30 happens twice in New York on 2026-11-01 (05:30 and 06:30 UTC)."""
    monkeypatch.setattr(commit, "FOLD_EVERY", 1)  # the state table holds every batch
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


# A changed definition: the field the refusal names, and the rows live after a full refresh.
DRIFTS = [
    ({"keys": ["userId", "name"]}, "keys", 4),  # (123, NULL) is quarantined
    ({"sequence_by": "cast(sequenceNum as int)"}, "sequence type", 3),
    ({"stored_as_scd_type": 2}, "stored_as_scd_type", 3),
]


def test_definition_drift_is_refused_until_a_full_refresh(spark, new_table):
    """Each changed definition is refused, naming the field, the target untouched; a
    misspelled key is still a typo to fix (as on a fresh target), not a definition change
    that asks for a full refresh. Each changed flow runs after its full refresh."""
    target = new_table("drift")
    users_flow(target).apply(spark.createDataFrame(EXAMPLE, SCHEMA))
    commits = spark.sql(f"DESCRIBE HISTORY {target}").count()
    for change, field, _ in DRIFTS:
        with pytest.raises(autocdc.DefinitionChangedError) as err:
            users_flow(target, **change).apply(spark.createDataFrame(EXAMPLE, SCHEMA))
        assert err.value.params["field"] == field
    with pytest.raises(autocdc.UnknownColumnError) as typo:
        users_flow(target, keys=["userid_typo"]).apply(spark.createDataFrame(EXAMPLE, SCHEMA))
    assert (typo.value.params["field"], typo.value.params["columns"]) == ("keys", ["userid_typo"])
    assert spark.sql(f"DESCRIBE HISTORY {target}").count() == commits
    assert_target(spark, target, EXPECTED)
    for change, _, live in DRIFTS:
        changed = users_flow(target, **change)
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
