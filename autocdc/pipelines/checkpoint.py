"""An extraction flow's checkpoint: one JSON file in the flow's checkpoint folder.

``<storage>/checkpoints/<flow>/extraction.json`` holds the source's definition (what the
checkpoint depends on: :meth:`Extraction.definition`), the checkpoint itself (the cursor's
merged accumulator, :func:`extract.dumps`), and the rows and batches of the run that
wrote it. It is replaced atomically (a private file, flushed, then renamed over it), so a
kill leaves the previous checkpoint or the next, never a torn one; a full refresh removes
it with the folder.
"""

from __future__ import annotations

import os
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from autocdc.sources import extract
from autocdc.sources.errors import ExtractionChangedError

FILE = "extraction.json"
FORMAT = 1


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
        self.path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_name(f".{FILE}.{uuid.uuid4().hex}.tmp")
        with open(partial, "w") as out:
            out.write(extract.dumps(record, source.name))
            out.flush()
            os.fsync(out.fileno())
        os.replace(partial, self.path)
        folder = os.open(self.path.parent, os.O_RDONLY)
        try:  # the rename itself survives a crash of the machine
            os.fsync(folder)
        finally:
            os.close(folder)
