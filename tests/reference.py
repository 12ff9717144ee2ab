"""A pure-Python model of the fold in SEMANTICS.md: the oracle the engine is checked against.

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
