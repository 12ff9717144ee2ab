"""The engine equals the reference fold for any arrival order, batching, duplicates and
replays (property-based; bounded by the hypothesis profile in conftest.py)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reference import DELETE, TRUNCATE, UPSERT, Change, fold_scd1

import autocdc

SCHEMA = "id int, a string, b int, op string, seq long"
_targets = itertools.count()

changes = st.builds(
    Change,
    key=st.integers(1, 3),
    seq=st.integers(1, 6),
    op=st.sampled_from([UPSERT, UPSERT, UPSERT, DELETE, DELETE, TRUNCATE]),
    values=st.tuples(st.sampled_from([None, "x", "y"]), st.sampled_from([None, 1, 2])),
).map(lambda c: Change(None, c.seq, TRUNCATE) if c.op == TRUNCATE else c)


@st.composite
def arrivals(draw):
    """A change set, then how it arrives: shuffled, split, with resends and a replay."""
    chosen = draw(st.lists(changes, min_size=1, max_size=10))
    order = draw(st.permutations(chosen))
    cuts = sorted(draw(st.sets(st.integers(1, max(1, len(order) - 1)), max_size=2)))
    batches = [order[i:j] for i, j in itertools.pairwise([0, *cuts, len(order)]) if order[i:j]]
    resent = draw(st.lists(st.sampled_from(chosen), max_size=3))
    batches[-1] = batches[-1] + resent
    if draw(st.booleans()):
        batches.append(draw(st.sampled_from(batches)))  # a batch applied twice
    return chosen, batches


def to_rows(batch: list[Change]) -> list[tuple]:
    return [
        (c.key, *c.values, c.op, c.seq) if c.values else (c.key, None, None, c.op, c.seq)
        for c in batch
    ]


@pytest.mark.parametrize("ignore_null_updates", [False, True])
@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=arrivals())
def test_engine_matches_reference_fold(spark, ignore_null_updates, case):
    chosen, batches = case
    target = f"prop_{next(_targets)}"
    flow = autocdc.AutoCdcFlow(
        target=target,
        keys=["id"],
        sequence_by="seq",
        apply_as_deletes="op = 'D'",
        apply_as_truncates="op = 'T'",
        except_column_list=["op", "seq"],
        ignore_null_updates=ignore_null_updates,
    )
    for batch in batches:
        flow.apply(spark.createDataFrame(to_rows(batch), SCHEMA))
    got = {r.id: (r.a, r.b) for r in spark.table(target).collect()}
    assert got == fold_scd1(chosen, ignore_null_updates=ignore_null_updates), batches
