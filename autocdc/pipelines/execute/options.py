"""What a run is asked to do: :class:`Options`, given by ``autocdc run`` and ``dp.run``,
read by the runner and by each flow's kind (:mod:`autocdc.pipelines.execute.kinds`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from autocdc.pipelines.execute.replay import Replay
from autocdc.sources.extract import ExtractionOptions


@dataclass
class Options:
    full_refresh: set[str] = field(default_factory=set)
    full_refresh_all: bool = False
    refresh: set[str] | None = None  # None: every dataset
    continuous: bool = False
    trigger_seconds: float = 10.0
    extract: ExtractionOptions | None = None  # replace every extraction flow's and source's
    # Datasets whose snapshot flows may delete beyond their max_delete_fraction this run.
    expect_deletes: set[str] = field(default_factory=set)
    replay_from: Replay | None = None  # one flow rewound to a position of its source

    def resets(self, name: str) -> bool:
        """Whether dataset ``name`` is dropped by a full refresh before it runs."""
        return self.full_refresh_all or name in self.full_refresh
