"""What one ``apply`` did, as counts a pipeline can log, alert on and test against."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

from autocdc.engine.batch import Counts, Plan
from autocdc.engine.spec import FlowDefinition


@dataclass(frozen=True)
class BatchMetrics:
    """Counts for one micro-batch.

    ``rows_in``: the rows that carry a change; ``skipped``: rows a source marked as
    carrying none (a Kafka tombstone), neither applied nor quarantined.
    ``ignored_stale``: changes at or below the sequence the state already held for
    their key (late arrivals and replays). ``conflicts``: keys where two different upserts
    had one sequence (the tie rule picked the winner: in the batch, or, against an upsert
    of an earlier batch, in the target MERGE, and then ``upserted`` says whether the new
    one won). With ``ignore_null_updates`` only ties inside one batch are counted.
    ``late_beyond_horizon``: changes at or below the collected-tombstone horizon for a
    key with no state (quarantined by default). ``steps``: seconds per step (see
    :class:`Steps`), where the batch's time went.
    """

    flow: str
    batch_id: int
    rows_in: int
    skipped: int
    upserted: int
    deleted: int
    ignored_stale: int
    duplicates_dropped: int
    conflicts: int
    quarantined: int
    late_beyond_horizon: int
    truncates: int
    tombstones_written: int
    tombstones_live: int
    tombstones_collected: int
    seconds: float
    steps: dict[str, float] = field(default_factory=dict)
    # A flow with max_staleness: the micro-batch's stage id, the staged rows an apply
    # took (0: none ran), and what is staged after the call (not applied yet).
    stage_id: int | None = None
    applied_staged: int = 0
    staged_batches: int = 0
    staged_rows: int = 0
    oldest_staged_seconds: float | None = None
    # The rows this micro-batch staged (its rows not quarantined; 0 for a replay): what a
    # progress line or ``autocdc history`` says happened to rows not applied yet.
    rows_staged: int = 0

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


class Steps:
    """Seconds per step of one batch, in the order they ran: ``prepare`` (definition,
    tables, catch-up), ``stage`` (validate, deduplicate), ``plan`` (state lookup and
    reconcile), ``quarantine``, ``redo`` (the batch's outcome written first), ``merge``
    (the target), ``state`` (state and quarantine appended), ``maintain`` (compaction).
    Spark runs a step's jobs where it is materialized, so lazy work counts in the step
    that forces it."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._at = time.perf_counter()

    def lap(self, step: str) -> None:
        """Close ``step``: the time since the previous lap is its."""
        now = time.perf_counter()
        self.seconds[step] = round(self.seconds.get(step, 0.0) + now - self._at, 3)
        self._at = now


def measured(
    spec: FlowDefinition,
    started: float,
    batch_id: int,
    counts: Counts,
    steps: Steps,
    plan: Plan | None = None,
    merged: dict[str, int] | None = None,
    quarantined: int = 0,
    collected: int = 0,
    tombstones: int = 0,
) -> BatchMetrics:
    """A batch's metrics from its counts, its plan's stats and its MERGE's counts (no
    plan: nothing was planned, e.g. an empty batch); ``tombstones`` held before the
    ``collected`` ones went."""
    stats = {} if plan is None else plan.stats
    merged = merged or {}
    if spec.stored_as_scd_type == 1:
        if plan is not None and plan.load is not None:  # appended: every action inserts
            upserted = stats["actions"]
        else:
            upserted = merged.get("num_inserted_rows", 0) + merged.get("num_updated_rows", 0)
        deleted = merged.get("num_deleted_rows", 0)
    else:
        upserted, deleted = stats.get("upserted", 0), stats.get("deleted", 0)
    return BatchMetrics(
        flow=spec.flow_name,
        batch_id=batch_id,
        rows_in=counts.rows_in,
        skipped=counts.skipped,
        upserted=upserted,
        deleted=deleted,
        ignored_stale=stats.get("stale", 0),
        duplicates_dropped=counts.keyed - stats.get("distinct", counts.keyed),
        conflicts=stats.get("conflicts", 0),
        quarantined=quarantined,
        late_beyond_horizon=stats.get("late", 0),
        truncates=counts.truncates,
        tombstones_written=stats.get("tombstones_written", 0),
        tombstones_live=tombstones - collected,
        tombstones_collected=collected,
        seconds=round(time.perf_counter() - started, 3),
        steps=steps.seconds,
    )
