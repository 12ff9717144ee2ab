"""An extraction flow's checkpoint: one JSON file in the flow's checkpoint folder.

``<storage>/checkpoints/<flow>/extraction.json`` holds the source's definition (what the
checkpoint depends on: :meth:`Extraction.definition`), the checkpoint itself (the cursor's
merged accumulator, :func:`extract.dumps`), and the rows and batches of the run that
wrote it. It is replaced atomically (a private file, flushed, then renamed over it), so a
kill leaves the previous checkpoint or the next, never a torn one; a full refresh removes
it with the folder.

``extraction-read`` beside it holds the sequence of the flow's last read (see
:meth:`CheckpointFile.next_read`), and ``extraction-run`` what the last successful run
saw of the source (:meth:`CheckpointFile.finished`), which ``autocdc status`` reports as
the flow's lag.
"""

from __future__ import annotations

import os
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from autocdc.sources import extract
from autocdc.sources.errors import ExtractionChangedError

FILE = "extraction.json"
READ = "extraction-read"
RUN = "extraction-run"
FORMAT = 1


def write_atomically(path: Path, text: str) -> None:
    """Write ``path`` atomically: a private file, flushed, renamed over it, and the
    rename itself made to survive a crash of the machine."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    with open(partial, "w") as out:
        out.write(text)
        out.flush()
        os.fsync(out.fileno())
    os.replace(partial, path)
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)


class CheckpointFile:
    def __init__(self, folder: Path) -> None:
        self.path = folder / FILE

    def read(self, source: extract.Extraction, flow: str, dataset: str) -> Any:
        """The stored checkpoint (None: none yet); refused when it was taken under another
        definition of the source."""
        try:
            stored = extract.loads(self.path.read_text())
        except FileNotFoundError:
            return None
        declared = source.definition()
        if stored["definition"] != declared:
            raise ExtractionChangedError(
                flow=flow,
                source=source.name,
                stored=stored["definition"],
                declared=declared,
                dataset=dataset,
            )
        return stored["checkpoint"]

    def write(self, source: extract.Extraction, checkpoint: Any, rows: int, batches: int) -> None:
        """Replace the checkpoint with ``checkpoint``."""
        record = {
            "format": FORMAT,
            "source": source.name,
            "definition": source.definition(),
            "checkpoint": checkpoint,
            "rows": rows,
            "batches": batches,
            "written": datetime.now(timezone.utc).isoformat(timespec="milliseconds"),
        }
        write_atomically(self.path, extract.dumps(record, source.name))

    def finished(self, source: extract.Extraction, record: dict[str, Any]) -> None:
        """Note a successful run: ``record`` (its rows, the checkpoint, the source's newest
        values and how far behind them the checkpoint is), with the time it ended."""
        ended = datetime.now(timezone.utc).isoformat(timespec="milliseconds")
        write_atomically(
            self.path.with_name(RUN), extract.dumps({**record, "ended": ended}, source.name)
        )

    def last_run(self) -> dict[str, Any] | None:
        """What :meth:`finished` noted last (None: no run has succeeded)."""
        try:
            return extract.loads(self.path.with_name(RUN).read_text())
        except FileNotFoundError:
            return None

    def next_read(self) -> int:
        """The sequence of the read a run is about to make: microseconds since the epoch,
        above every read of the flow before it. Written before the read, so a run killed
        after applying its rows leaves its number taken, and a later read always sorts
        after an earlier one, whatever the clock did in between."""
        stored = self.path.with_name(READ)
        try:
            last = int(stored.read_text())
        except FileNotFoundError:
            last = 0
        read = max(time.time_ns() // 1000, last + 1)
        write_atomically(stored, str(read))
        return read
