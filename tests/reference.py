"""A pure-Python model of the fold in docs/semantics.md: the oracle the engine is checked against.

Deliberately naive: it sorts every distinct change and applies them one at a time, the
definition itself, with none of the engine's per-key compaction.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

UPSERT, DELETE, TRUNCATE = "U", "D", "T"


@dataclass(frozen=True)
class Change:
    key: Any  # None for a truncate
    seq: Any
    op: str
    values: tuple[Any, ...] = ()  # non-key columns of an upsert, in target order


def _low_null(value: Any) -> tuple[int, Any]:
    """Order with NULL lowest, as Spark orders struct fields."""
    return (0, 0) if value is None else (1, value)


def _distinct(changes: Iterable[Change]) -> set[Change]:
    """A delete or truncate is its key and sequence only: drop whatever payload it carries."""
    return {c if c.op == UPSERT else Change(c.key, c.seq, c.op) for c in changes}


def _merge_ties(upserts: list[Change], ignore_null_updates: bool) -> tuple[Any, ...]:
    """Resolve different upserts at one key and sequence (the documented tie rule)."""
    if not ignore_null_updates:
        return max((u.values for u in upserts), key=lambda vs: tuple(map(_low_null, vs)))
    columns = zip(*(u.values for u in upserts), strict=True)
    return tuple(
        max((v for v in column if v is not None), default=None, key=_low_null) for column in columns
    )


def fold_scd1(
    changes: Iterable[Change], ignore_null_updates: bool = False
) -> dict[Any, tuple[Any, ...]]:
    """The SCD type 1 target: live key -> its non-key values."""
    distinct = _distinct(changes)
    grouped: dict[tuple[Any, Any], list[Change]] = {}
    steps: list[tuple[Any, int, Any, Any]] = []  # (seq, rank, key, values)
    for change in distinct:
        if change.op == UPSERT:
            grouped.setdefault((change.key, change.seq), []).append(change)
        else:
            steps.append((change.seq, 1, change.key if change.op == DELETE else None, change.op))
    for (key, seq), upserts in grouped.items():
        steps.append((seq, 0, key, _merge_ties(upserts, ignore_null_updates)))

    target: dict[Any, tuple[Any, ...]] = {}
    for _seq, _rank, key, payload in sorted(steps, key=lambda s: (s[0], s[1])):
        if payload == TRUNCATE:
            target.clear()
        elif payload == DELETE:
            target.pop(key, None)
        elif ignore_null_updates and key in target:
            current = target[key]
            target[key] = tuple(
                c if n is None else n for c, n in zip(current, payload, strict=True)
            )
        else:
            target[key] = payload
    return target


def fold_scd2(
    changes: Iterable[Change],
    tracked: list[int] | None = None,
    ignore_null_updates: bool = False,
) -> set[tuple[Any, tuple[Any, ...], Any, Any]]:
    """The SCD type 2 target: {(key, values, start, end)}, end None for the current version.

    ``tracked`` holds the indexes of tracked value columns (None: all).
    """
    distinct = _distinct(changes)
    grouped: dict[tuple[Any, Any], list[Change]] = {}
    steps: list[tuple[Any, Any, int, Any]] = []  # (key, seq, rank, values or None)
    for change in distinct:
        if change.op == UPSERT:
            grouped.setdefault((change.key, change.seq), []).append(change)
        elif change.op == DELETE:
            steps.append((change.key, change.seq, 1, None))
    for (key, seq), upserts in grouped.items():
        steps.append((key, seq, 0, _merge_ties(upserts, ignore_null_updates)))

    versions: set[tuple[Any, tuple[Any, ...], Any, Any]] = set()
    open_versions: dict[Any, tuple[tuple[Any, ...], Any]] = {}  # key -> (values, start)

    def close(key: Any, end: Any) -> None:
        values, start = open_versions.pop(key)
        if start != end:  # a version that starts and ends at one sequence is not stored
            versions.add((key, values, start, end))

    for key, seq, _rank, values in sorted(steps, key=lambda s: (s[1], s[2])):
        if values is None:
            if key in open_versions:
                close(key, seq)
            continue
        if key in open_versions:
            current, start = open_versions[key]
            if ignore_null_updates:
                values = tuple(c if n is None else n for c, n in zip(current, values, strict=True))
            idx = range(len(values)) if tracked is None else tracked
            if all(current[i] == values[i] for i in idx):
                open_versions[key] = (values, start)  # untracked columns change in place
                continue
            close(key, seq)
        open_versions[key] = (values, seq)
    versions |= {(k, v, s, None) for k, (v, s) in open_versions.items()}
    return versions


def snapshot_changes(snapshots: Iterable[tuple[Any, dict[Any, tuple[Any, ...]]]]) -> list[Change]:
    """The changes a series of snapshots ``(version, {key: values})``, in ascending version
    order, stands for: against the previous snapshot, a new or changed row is an upsert and
    a missing key a delete, at the snapshot's version; an unchanged row is no change."""
    changes: list[Change] = []
    previous: dict[Any, tuple[Any, ...]] = {}
    for version, rows in snapshots:
        changes += [
            Change(k, version, UPSERT, v)
            for k, v in rows.items()
            if k not in previous or previous[k] != v
        ]
        changes += [Change(k, version, DELETE) for k in previous if k not in rows]
        previous = rows
    return changes
