"""A streaming checkpoint that never logged its first micro-batch: started afresh.

Spark (4.x) refuses to start a query at batch 0 unless its checkpoint's ``offsets``,
``commits`` and ``state`` folders are empty (``STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY``):
a guard against two queries sharing one folder. A run killed while its query wrote its
first offsets entry leaves a temporary file there (``.0.<uuid>.tmp`` and its ``.crc``),
and every later run then fails the same way. The runner owns each flow's folder, so no
other query shares it; and with no batch in the offsets log, nothing was read for the
flow, let alone applied (a micro-batch runs only after its offsets entry is written).
Clearing those three folders is therefore exactly the start Spark would make on an empty
folder. The query's id (``metadata``) and the sources' own logs (``sources/``) stay: Spark's
sources resume from a log written before the kill by design.
"""

from __future__ import annotations

import shutil
from pathlib import Path

SPARK_FOLDERS = ("offsets", "commits", "state")


def logged(checkpoint: Path) -> bool:
    """Whether the checkpoint's offsets log holds a micro-batch (a file named by its id)."""
    offsets = checkpoint / "offsets"
    return offsets.is_dir() and any(p.name.isdigit() for p in offsets.iterdir())


def leftovers(checkpoint: Path) -> list[str]:
    """The files in the folders Spark wants empty at batch 0, relative to the checkpoint."""
    return [
        str(path.relative_to(checkpoint))
        for folder in SPARK_FOLDERS
        if (checkpoint / folder).is_dir()
        for path in sorted((checkpoint / folder).rglob("*"))
        if path.is_file()
    ]


def clear(checkpoint: Path, notes: tuple[str, ...] = ()) -> list[str]:
    """Clear what a killed first micro-batch left in ``checkpoint`` (and the runner's
    ``notes`` beside it, which no batch of a never-logged query can have earned); the
    files removed, relative to the checkpoint (none: it logged a batch, or is clean)."""
    if not checkpoint.is_dir() or logged(checkpoint):
        return []
    left = leftovers(checkpoint) + [note for note in notes if (checkpoint / note).is_file()]
    if not left:
        return []
    for folder in SPARK_FOLDERS:
        shutil.rmtree(checkpoint / folder, ignore_errors=True)
    for note in notes:
        (checkpoint / note).unlink(missing_ok=True)
    return left
