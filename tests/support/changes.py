"""Change sets shared by the engine's and the pipelines' tests, as the reference fold's
changes over ``(id, a, b)``: three batches that disagree in every way a feed can, and
one set with every hard case for the kill tests, and the flow that reads them."""

from __future__ import annotations

from typing import Any

from reference import DELETE, UPSERT, Change

import autocdc


def feed_flow(target: str, scd_type: int = 1, **options: Any) -> autocdc.AutoCdcFlow:
    """The flow of the tests' change feeds ``(id, a, b, op, seq)``: key ``id``, sequence
    ``seq``, ``op = 'D'`` deletes, ``op`` and ``seq`` left out of the target; ``options``:
    any other of the flow's."""
    return autocdc.AutoCdcFlow(
        target=target,
        keys=["id"],
        sequence_by="seq",
        apply_as_deletes="op = 'D'",
        except_column_list=["op", "seq"],
        stored_as_scd_type=scd_type,
        **options,
    )


A = [Change(1, 2, UPSERT, ("a1", 1)), Change(2, 1, UPSERT, ("b1", 1)), Change(3, 5, DELETE)]
B = [Change(2, 3, UPSERT, ("b2", 2)), Change(3, 4, UPSERT, ("c-old", 0)), Change(1, 1, DELETE)]
C = [Change(1, 6, DELETE), Change(4, 1, UPSERT, ("d1", None)), Change(2, 3, UPSERT, ("b2", 2))]
# Out of order, delete before insert, a delete then an older upsert, a reinsert, a tie of
# two upserts, an upsert and a delete at one sequence.
EVERYTHING = [
    Change(1, 2, UPSERT, ("a1", 1)),
    Change(2, 1, UPSERT, ("b1", 1)),
    Change(3, 5, DELETE),
    Change(2, 3, UPSERT, ("b2", 2)),
    Change(3, 4, UPSERT, ("c-old", 0)),
    Change(1, 1, DELETE),
    Change(1, 6, DELETE),
    Change(4, 1, UPSERT, ("d1", None)),
    Change(4, 3, UPSERT, ("d3", 1)),
    Change(4, 3, UPSERT, ("d2", 2)),
    Change(5, 2, UPSERT, ("e1", 0)),
    Change(5, 4, DELETE),
    Change(5, 7, UPSERT, ("e2", None)),
    Change(6, 2, UPSERT, ("f1", 1)),
    Change(6, 2, DELETE),
]


def rows(changes: list[Change]) -> list[tuple]:
    """``changes`` as rows ``(id, a, b, op, seq)``."""
    return [(c.key, *(c.values or (None, None)), c.op, c.seq) for c in changes]
