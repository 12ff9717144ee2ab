"""An extraction flow's step as the extraction tests run it: with an ``apply`` that only
collects the rows (no Delta), its files under the test's folder; and a run's queries made
to time out, as a busy database's do."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from types import ModuleType

import pytest

from autocdc.pipelines.execute.extraction import Step
from autocdc.sources.extract import Extraction


def step(tmp_path: Path, src: Extraction, flow: str = "f", **more) -> Step:
    return Step(
        source=src,
        flow=flow,
        dataset=flow,
        checkpoints=tmp_path / "checkpoints" / flow,
        storage=tmp_path / "storage",
        pipeline="test",
        **more,
    )


def collect(df, read=None) -> list[tuple]:
    """The rows, sorted whatever their types (an apply: ``read`` is the read's sequence)."""
    return sorted((tuple(r) for r in df.collect()), key=repr)


class Timeouts:
    """Makes chosen queries of a run time out for real: a query named by :meth:`inject`
    (a function of ``module``: ``newest``, ``edge``, ``read_batch``...) runs while
    ``hold()`` locks its table, so the database itself cancels it (PostgreSQL's
    ``statement_timeout``, SQLite's busy timeout) with its own words. ``seen``: the
    queries that timed out, in order."""

    def __init__(
        self,
        monkeypatch: pytest.MonkeyPatch,
        module: ModuleType,
        hold: Callable[[], AbstractContextManager],
    ) -> None:
        self.monkeypatch, self.module, self.hold = monkeypatch, module, hold
        self.left: dict[str, int] = {}
        self.seen: list[str] = []

    def inject(self, **times: int) -> None:
        """The next ``times[name]`` calls of each ``module.name`` time out."""
        for name, count in times.items():
            if name not in self.left:
                self.monkeypatch.setattr(self.module, name, self._slowed(name))
            self.left[name] = count

    def _slowed(self, name: str) -> Callable:
        real = getattr(self.module, name)

        def slowed(*args, **kwargs):
            if self.left[name] <= 0:
                return real(*args, **kwargs)
            self.left[name] -= 1
            self.seen.append(name)
            with self.hold():
                return real(*args, **kwargs)

        return slowed
