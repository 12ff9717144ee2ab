"""What one ``apply`` did, as counts a pipeline can log, alert on and test against."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class BatchMetrics:
    """Counts for one micro-batch.

    ``ignored_stale``: changes at or below the sequence the state already held for
    their key (late arrivals and replays). ``conflicts``: keys where two different upserts
    had one sequence (the tie rule picked the winner: in the batch, or, against an upsert
    of an earlier batch, in the target MERGE, and then ``upserted`` says whether the new
    one won). With ``ignore_null_updates`` only ties inside one batch are counted.
    ``late_beyond_horizon``: changes at or below the collected-tombstone horizon for a
    key with no state (quarantined by default).
    """

    flow: str
    batch_id: int
    rows_in: int
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

    def as_dict(self) -> dict[str, object]:
        return asdict(self)
