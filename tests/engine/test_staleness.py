"""Flows with ``max_staleness``: micro-batches are staged, applied later as one batch, and
``current()`` / ``fresh()`` merge the staged changes at read time.

The property: whatever the arrival order and batching, with stage, apply and read
interleaved at random points, every read equals the reference fold of the changes
staged so far (SCD1 with deletes and truncates, SCD2's whole history), and the applied
target equals it once everything is applied. Data is tiny and examples few (each stage,
apply and read costs Spark jobs).
"""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql.types import LongType, StringType, StructField, StructType
from reference import DELETE, TRUNCATE, UPSERT, Change, fold_scd1, fold_scd2

import autocdc
from autocdc.engine import staged_table as staged

SCHEMA = StructType(
    [
        StructField("id", LongType()),
        StructField("name", StringType()),
        StructField("n", LongType()),
        StructField("op", StringType()),
        StructField("seq", LongType()),
    ]
)
VALUES = ["n", "name"]  # the tie order: value columns sorted by name
READ, APPLY = "read", "apply"
_targets = itertools.count()


def _flow(target: str, scd_type: int, **options: Any) -> autocdc.AutoCdcFlow:
    declared = {
        "target": target,
        "keys": ["id"],
        "sequence_by": "seq",
        "apply_as_deletes": "op = 'D'",
        "apply_as_truncates": "op = 'T'" if scd_type == 1 else None,
        "except_column_list": ["op", "seq"],
        "stored_as_scd_type": scd_type,
        "max_staleness": "1 hour",
    }
    return autocdc.AutoCdcFlow(**(declared | options))


def _row(change: Change) -> tuple[Any, ...]:
    name, n = change.values if change.values else (None, None)
    return (change.key, name, n, change.op, change.seq)


def _applicable(changes: list[Change]) -> list[Change]:
    """The changes the fold takes (values in the tie order), not the quarantined ones."""
    return [
        Change(c.key, c.seq, c.op, (c.values[1], c.values[0]) if c.values else ())
        for c in changes
        if c.seq is not None and (c.key is not None or c.op == TRUNCATE)
    ]


@dataclass(frozen=True)
class Case:
    batches: list[list[Change]]
    after: list[list[str]]  # what runs after each batch: reads and applies, in order
    max_staged_rows: int | None


@st.composite
def cases(draw, scd_type: int) -> Case:
    ops = [UPSERT, UPSERT, UPSERT, DELETE] + ([TRUNCATE] if scd_type == 1 else [])

    @st.composite
    def change(draw) -> Change:
        op = draw(st.sampled_from(ops))
        key = None if op == TRUNCATE else draw(st.sampled_from([1, 2, 3, 3, None]))
        seq = draw(st.sampled_from([1, 2, 3, 4, 4, None]))
        values = (
            ()
            if op == TRUNCATE
            else (draw(st.sampled_from(["x", "y", None])), draw(st.sampled_from([0, 1, None])))
        )
        return Change(key, seq, op, values)

    # Two upserts at one key and sequence whose winner depends on the column order.
    tie = [Change(2, 3, UPSERT, ("y", 0)), Change(2, 3, UPSERT, ("x", 1))]
    changes = list(dict.fromkeys(draw(st.lists(change(), min_size=1, max_size=6)) + tie))
    order = draw(st.permutations(changes))
    n_batches = draw(st.integers(1, 3))
    cuts = sorted(draw(st.sets(st.integers(1, len(order) - 1), max_size=n_batches - 1)))
    batches = [order[i:j] for i, j in itertools.pairwise([0, *cuts, len(order)]) if order[i:j]]
    resent = draw(st.lists(st.sampled_from(changes), max_size=2))
    batches[-1] = [*batches[-1], *resent]
    steps = st.lists(st.sampled_from([READ, APPLY]), max_size=2)
    after = [draw(steps) for _ in batches]
    return Case(batches, after, draw(st.sampled_from([None, None, 4])))


def _got(flow: autocdc.AutoCdcFlow, spark, scd_type: int) -> Counter:
    if scd_type == 1:
        rows = flow.current(spark).collect()
        return Counter((r["id"], (r["n"], r["name"])) for r in rows)
    rows = flow.fresh(spark).collect()
    return Counter((r["id"], (r["n"], r["name"]), r["__START_AT"], r["__END_AT"]) for r in rows)


def _want(changes: list[Change], scd_type: int) -> Counter:
    applicable = _applicable(changes)
    if scd_type == 1:
        return Counter(fold_scd1(applicable).items())
    return Counter(fold_scd2(applicable))


@pytest.mark.parametrize("scd_type", [1, 2], ids=["scd1", "scd2"])
@settings(suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_reads_equal_the_fold_of_the_changes_staged_so_far(spark, scd_type, data):
    case = data.draw(cases(scd_type), label="case")
    target = f"stale_{scd_type}_{next(_targets)}"
    flow = _flow(target, scd_type, max_staged_rows=case.max_staged_rows)
    received: list[Change] = []
    for batch, after in zip(case.batches, case.after, strict=True):
        flow.stage(spark.createDataFrame([_row(c) for c in batch], SCHEMA))
        received += batch
        for step in after:
            if step == APPLY:
                flow.apply_staged(spark)
            else:
                assert _got(flow, spark, scd_type) == _want(received, scd_type)
    assert _got(flow, spark, scd_type) == _want(received, scd_type)
    if scd_type == 2:  # the current rows too
        current = Counter((r["id"], (r["n"], r["name"])) for r in flow.current(spark).collect())
        want = Counter((k, v) for k, v, _, end in _want(received, 2).elements() if end is None)
        assert current == want
    flow.apply_staged(spark)
    assert flow.staged_status(spark).rows == 0
    applied = spark.read.table(target)
    if scd_type == 1:
        got = Counter((r["id"], (r["n"], r["name"])) for r in applied.collect())
        assert got == _want(received, 1)
    else:
        rows = applied.collect()
        got = Counter((r["id"], (r["n"], r["name"]), r["__START_AT"], r["__END_AT"]) for r in rows)
        assert got == _want(received, 2)


def test_a_replayed_stage_id_stages_and_quarantines_nothing_twice(spark):
    flow = _flow(f"stale_replay_{next(_targets)}", 1)
    rows = [(1, "a", 1, "U", 1), (None, "b", 2, "U", 2), (2, "c", 3, "U", 3)]
    df = spark.createDataFrame(rows, SCHEMA)
    first = flow.stage(df, stage_id=7)
    again = flow.stage(df, stage_id=7)
    assert (first.rows_in, first.quarantined, first.staged_rows) == (3, 1, 2)
    assert (again.rows_in, again.staged_rows, again.staged_batches) == (0, 2, 1)
    assert spark.read.table(flow.quarantine_table).count() == 1
    assert sorted(r["id"] for r in flow.current(spark).collect()) == [1, 2]
    assert spark.read.table(flow.target).count() == 0  # nothing applied yet
    metrics = flow.apply_staged(spark)
    assert metrics is not None and metrics.upserted == 2
    assert flow.apply_staged(spark) is None
    assert sorted(r["id"] for r in spark.read.table(flow.target).collect()) == [1, 2]


def test_staged_changes_are_applied_when_due(spark):
    flow = _flow(f"stale_due_{next(_targets)}", 2, max_staged_rows=3)
    one = flow.stage(spark.createDataFrame([(1, "a", 1, "U", 1), (2, "b", 1, "U", 1)], SCHEMA))
    assert (one.applied_staged, one.staged_rows) == (0, 2)
    two = flow.stage(spark.createDataFrame([(1, "c", 1, "U", 2)], SCHEMA))
    assert (two.applied_staged, two.staged_rows, two.upserted) == (3, 0, 3)
    assert spark.read.table(flow.target).count() == 3
    # max_staleness 0: every micro-batch is applied at once.
    now = _flow(flow.target, 2, max_staleness=timedelta(0), name="now")
    three = now.stage(spark.createDataFrame([(2, "d", 1, "D", 5)], SCHEMA))
    assert (three.applied_staged, three.staged_rows) == (1, 0)
    assert now.current(spark).count() == 1


def test_full_refresh_drops_the_staged_changes(spark):
    flow = _flow(f"stale_refresh_{next(_targets)}", 1)
    flow.stage(spark.createDataFrame([(1, "a", 1, "U", 1)], SCHEMA))
    flow.full_refresh(spark)
    assert not spark.catalog.tableExists(staged.table_of(flow.target))
    assert flow.staged_status(spark).rows == 0


@pytest.mark.parametrize(
    "options",
    [
        {"ignore_null_updates": True},
        {"columns_to_update": ["name"]},
        {"partial_target": True},
        {
            "sequence_groups": {"g": ["name", "n"]},
            "sequence_group": "g",
            "apply_as_truncates": None,
        },
    ],
    ids=["ignore_null_updates", "columns_to_update", "partial_target", "sequence_groups"],
)
def test_partial_upserts_with_max_staleness_are_refused(options):
    with pytest.raises(autocdc.MaxStalenessUnsupportedError) as refused:
        _flow("t", 1, **options)
    assert refused.value.error_class == "AUTOCDC_MAX_STALENESS_UNSUPPORTED"


@pytest.mark.parametrize(
    ("given_value", "seconds"),
    [
        ("10 minutes", 600),
        ("INTERVAL 10 MINUTE", 600),
        ("1 hour 30 minutes", 5400),
        (90, 90),
        (timedelta(seconds=5), 5),
    ],
)
def test_max_staleness_takes_intervals(given_value, seconds):
    flow = _flow("t", 1, max_staleness=given_value)
    assert flow.max_staleness == timedelta(seconds=seconds)


@pytest.mark.parametrize("bad", ["soon", "-1 minute", "10 parsecs", -5])
def test_a_bad_interval_is_refused(bad):
    with pytest.raises(autocdc.InvalidMaxStalenessError):
        _flow("t", 1, max_staleness=bad)


def test_max_staged_rows_needs_max_staleness():
    with pytest.raises(autocdc.MaxStalenessUnsupportedError):
        autocdc.AutoCdcFlow(target="t", keys=["id"], sequence_by="seq", max_staged_rows=10)
