"""A pure-Python model of the fold in docs/semantics.md: the oracle the engine is checked against.

Deliberately naive: it sorts every distinct change and applies them one at a time, the
definition itself, with none of the engine's per-key compaction.

A change may set only some columns (a partial upsert: ``sets``, the indexes of the value
columns it sets). On a partial target, ties merge column by column over the upserts that
set the column, and an upsert leaves the columns it does not set as they are (NULL on a
key it brings back to life); on any other target ties compare whole rows.
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
    sets: frozenset[int] | None = None  # indexes of the values an upsert sets (None: all)


def _low_null(value: Any) -> tuple[int, Any]:
    """Order with NULL lowest, as Spark orders struct fields."""
    return (0, 0) if value is None else (1, value)


def _normal(change: Change, ignore_null_updates: bool) -> Change:
    """A change as the fold sees it: a delete or truncate is its key and sequence only; an
    upsert says which columns it sets (with ``ignore_null_updates`` not its NULLs), and the
    value of a column it does not set is no part of it."""
    if change.op != UPSERT:
        return Change(change.key, change.seq, change.op)
    every = range(len(change.values))
    sets = {i for i in (every if change.sets is None else change.sets)}
    if ignore_null_updates:
        sets = {i for i in sets if change.values[i] is not None}
    values = tuple(v if i in sets else None for i, v in enumerate(change.values))
    return Change(change.key, change.seq, UPSERT, values, frozenset(sets))


def _is_partial(changes: list[Change], ignore_null_updates: bool, partial: bool | None) -> bool:
    if partial is not None:
        return partial
    return ignore_null_updates or any(c.sets is not None for c in changes)


def _merge_ties(upserts: list[Change], partial: bool) -> Change:
    """Resolve different upserts at one key and sequence (the documented tie rule): the
    greatest row, or on a partial target per column the greatest value set, NULL lowest."""
    first = upserts[0]
    if not partial:
        values = max((u.values for u in upserts), key=lambda vs: tuple(map(_low_null, vs)))
        return Change(first.key, first.seq, UPSERT, values, first.sets)
    width = len(first.values)
    sets = frozenset(i for u in upserts for i in u.sets or ())
    values = tuple(
        max((u.values[i] for u in upserts if i in u.sets), key=_low_null) if i in sets else None
        for i in range(width)
    )
    return Change(first.key, first.seq, UPSERT, values, sets)


def _steps(changes: list[Change], partial: bool) -> list[tuple[Any, int, Any, Any]]:
    """(seq, rank, key, upsert or operation): one merged upsert per key and sequence, a
    delete or truncate ranked after it."""
    grouped: dict[tuple[Any, Any], list[Change]] = {}
    steps: list[tuple[Any, int, Any, Any]] = []
    for change in changes:
        if change.op == UPSERT:
            grouped.setdefault((change.key, change.seq), []).append(change)
        else:
            steps.append((change.seq, 1, change.key if change.op == DELETE else None, change.op))
    for (key, seq), upserts in grouped.items():
        steps.append((seq, 0, key, _merge_ties(upserts, partial)))
    return sorted(steps, key=lambda s: (s[0], s[1]))


def _set(current: tuple[Any, ...] | None, upsert: Change) -> tuple[Any, ...]:
    """The row after ``upsert``: the columns it sets, the others as they were (NULL on a
    key that was not live)."""
    if current is None or upsert.sets is None:
        return upsert.values
    return tuple(
        n if i in upsert.sets else c
        for i, (c, n) in enumerate(zip(current, upsert.values, strict=True))
    )


def fold_scd1(
    changes: Iterable[Change], ignore_null_updates: bool = False, partial: bool | None = None
) -> dict[Any, tuple[Any, ...]]:
    """The SCD type 1 target: live key -> its non-key values. ``partial`` (default: when
    NULLs are ignored or a change sets only some columns): the target is partial."""
    given = list(changes)
    is_partial = _is_partial(given, ignore_null_updates, partial)
    distinct = list({_normal(c, ignore_null_updates) for c in given})
    if not is_partial:
        distinct = [Change(c.key, c.seq, c.op, c.values) for c in distinct]
    target: dict[Any, tuple[Any, ...]] = {}
    for _seq, _rank, key, payload in _steps(distinct, is_partial):
        if payload == TRUNCATE:
            target.clear()
        elif payload == DELETE:
            target.pop(key, None)
        else:
            target[key] = _set(target.get(key), payload)
    return target


def fold_scd1_groups(
    changes: dict[str, Iterable[Change]], groups: dict[str, list[int]], width: int
) -> dict[Any, tuple[Any, ...]]:
    """SCD type 1 with sequence groups (docs/semantics.md): ``changes`` per group, each
    on its own clock; ``groups``: each group's value indexes. Each group is folded alone,
    its upserts setting only its columns (of those they set), its deletes wiping only
    them; a key is live while any group's greatest upsert is above its latest delete,
    and each column reads its group's fold (NULL where that group's key is not live)."""
    folds = {
        group: fold_scd1(
            [
                Change(
                    c.key,
                    c.seq,
                    c.op,
                    c.values,
                    frozenset(groups[group])
                    if c.sets is None
                    else frozenset(c.sets) & frozenset(groups[group]),
                )
                for c in given
            ],
            partial=True,
        )
        for group, given in changes.items()
    }
    owner = {i: group for group, indexes in groups.items() for i in indexes}
    keys = {k for fold in folds.values() for k in fold}
    return {
        k: tuple(
            folds.get(owner[i], {}).get(k, (None,) * width)[i] if i in owner else None
            for i in range(width)
        )
        for k in keys
    }


def fold_scd2(
    changes: Iterable[Change],
    tracked: list[int] | None = None,
    ignore_null_updates: bool = False,
    partial: bool | None = None,
) -> set[tuple[Any, tuple[Any, ...], Any, Any]]:
    """The SCD type 2 target: {(key, values, start, end)}, end None for the current version.

    ``tracked`` holds the indexes of tracked value columns (None: all).
    """
    given = list(changes)
    is_partial = _is_partial(given, ignore_null_updates, partial)
    distinct = [c for c in {_normal(c, ignore_null_updates) for c in given} if c.op != TRUNCATE]
    if not is_partial:
        distinct = [Change(c.key, c.seq, c.op, c.values) for c in distinct]
    steps = _steps(distinct, is_partial)

    versions: set[tuple[Any, tuple[Any, ...], Any, Any]] = set()
    open_versions: dict[Any, tuple[tuple[Any, ...], Any]] = {}  # key -> (values, start)

    def close(key: Any, end: Any) -> None:
        values, start = open_versions.pop(key)
        if start != end:  # a version that starts and ends at one sequence is not stored
            versions.add((key, values, start, end))

    for seq, _rank, key, payload in steps:
        if payload == DELETE:
            if key in open_versions:
                close(key, seq)
            continue
        current = open_versions.get(key)
        values = _set(current[0] if current else None, payload)
        if current is not None:
            idx = range(len(values)) if tracked is None else tracked
            if all(current[0][i] == values[i] for i in idx):
                open_versions[key] = (values, current[1])  # untracked columns change in place
                continue
            close(key, seq)
        open_versions[key] = (values, seq)
    versions |= {(k, v, s, None) for k, (v, s) in open_versions.items()}
    return versions


@dataclass(frozen=True)
class Snapshot:
    """A full snapshot taken at ``seq`` on the change feed's clock: every row as of then."""

    seq: Any
    rows: tuple[tuple[Any, tuple[Any, ...]], ...]  # (key, values), one per key


def fold_scd1_shared(changes: Iterable[Change], snapshots: Iterable[Snapshot]) -> dict[Any, tuple]:
    """The SCD type 1 target of change flows and snapshot flows sharing it
    (docs/pipelines.md): every distinct change and snapshot in ascending sequence order, a
    snapshot after every change at its own sequence (it covers them), each snapshot
    replacing the whole target with its rows. Snapshots at one sequence are one: per key
    the greatest row, as ties of upserts are."""
    distinct = [Change(c.key, c.seq, c.op, c.values) for c in {_normal(c, False) for c in changes}]
    at: dict[Any, dict[Any, list[tuple[Any, ...]]]] = {}
    for snapshot in snapshots:
        for key, values in snapshot.rows:
            at.setdefault(snapshot.seq, {}).setdefault(key, []).append(values)
        at.setdefault(snapshot.seq, {})
    steps: list[tuple[Any, int, Any, Any]] = _steps(distinct, False)
    for seq, rows in at.items():
        merged = {
            k: max(vs, key=lambda values: tuple(map(_low_null, values))) for k, vs in rows.items()
        }
        steps.append((seq, 2, None, merged))
    target: dict[Any, tuple[Any, ...]] = {}
    for _seq, _rank, key, payload in sorted(steps, key=lambda s: (s[0], s[1])):
        if isinstance(payload, dict):
            target = dict(payload)
        elif payload == TRUNCATE:
            target.clear()
        elif payload == DELETE:
            target.pop(key, None)
        else:
            target[key] = payload.values
    return target


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
