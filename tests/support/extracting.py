"""An extraction flow's step as the extraction tests run it: with an ``apply`` that only
collects the rows (no Delta), its files under the test's folder."""

from __future__ import annotations

from pathlib import Path

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
