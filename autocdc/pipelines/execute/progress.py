"""Progress of a run: a live table of the running flows on a terminal (rich), else the
plain ``autocdc: ...`` lines a log file or CI keeps."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from autocdc.pipelines.execute.position import Lag


@dataclass
class FlowProgress:
    flow: str
    batches: int = 0
    last_batch: int | None = None
    rows: int = 0
    seconds: float = 0.0
    lag: Lag | None = None
    state: str = "running"

    @property
    def rows_per_second(self) -> float | None:
        return self.rows / self.seconds if self.seconds > 0 else None


def describe_lag(lag: Lag | None) -> str:
    """``2 files (1.2 kB), 3 versions, oldest 40 s``; ``-`` when the sources cannot tell."""
    if lag is None:
        return "-"
    parts = []
    if lag.files is not None:
        parts.append(f"{lag.files} files ({lag.bytes or 0:,} bytes)")
    if lag.versions is not None:
        parts.append(f"{lag.versions} versions")
    if lag.records is not None:
        parts.append(f"{lag.records:,} records")
    if lag.oldest_age_seconds is not None:
        parts.append(f"oldest {lag.oldest_age_seconds:,.0f} s")
    return ", ".join(parts) or "-"


def merged(metrics: Mapping[str, Any]) -> int:
    """Rows of a batch (``BatchMetrics.as_dict()``) that changed nothing by themselves:
    a later change of their key in the same batch won, an exact duplicate, a delete of a
    key the target does not hold (kept as a tombstone). Read minus applied, stale and
    quarantined."""
    done = metrics["upserted"] + metrics["deleted"]
    return max(0, metrics["rows_in"] - done - metrics["ignored_stale"] - metrics["quarantined"])


def outcome(metrics: Mapping[str, Any]) -> str:
    """What a batch did with its rows, in words (``BatchMetrics.as_dict()``): ``read 5
    rows: 2 applied (2 upserted, 0 deleted), 3 merged within the batch, 0 stale, 0
    quarantined``. A flow with ``max_staleness`` says what it staged, what an apply of
    the staged rows did, and what is left staged (:func:`staged_outcome`): its 0
    upserted would read as rows dropped."""
    if staging(metrics):
        return staged_outcome(metrics)
    upserted, deleted = metrics["upserted"], metrics["deleted"]
    return (
        f"read {metrics['rows_in']:,} rows: {upserted + deleted:,} applied ({upserted:,} "
        f"upserted, {deleted:,} deleted), {merged(metrics):,} merged within the batch, "
        f"{metrics['ignored_stale']:,} stale, {metrics['quarantined']:,} quarantined"
    )


def staging(metrics: Mapping[str, Any]) -> bool:
    """Whether a batch is a ``max_staleness`` flow's: a micro-batch staged, or an apply of
    what was staged."""
    return metrics.get("stage_id") is not None or bool(metrics.get("applied_staged"))


def is_staged_apply(metrics: Mapping[str, Any]) -> bool:
    """Whether a batch is an apply of staged rows on its own (the end of a run,
    ``autocdc apply``, a quiet source's due apply), not a micro-batch of the source."""
    return metrics.get("stage_id") is None and bool(metrics.get("applied_staged"))


def rows_staged(metrics: Mapping[str, Any]) -> int | None:
    """The rows a micro-batch staged (None: no micro-batch was staged); an event logged
    before ``rows_staged`` was counted: its rows not quarantined."""
    if metrics.get("stage_id") is None:
        return None
    return metrics.get("rows_staged", metrics["rows_in"] - metrics["quarantined"])


def held(metrics: Mapping[str, Any]) -> str:
    """What is left staged after a batch: ``5 staged in 2 micro-batches, the oldest 45 s
    old``, or ``nothing staged``."""
    rows, batches = metrics.get("staged_rows", 0), metrics.get("staged_batches", 0)
    if not rows:
        return "nothing staged"
    age = metrics.get("oldest_staged_seconds")
    said = f"{rows:,} staged in {batches:,} micro-batch{'es' if batches != 1 else ''}"
    return said if age is None else f"{said}, the oldest {age:,.0f} s old"


def staged_outcome(metrics: Mapping[str, Any]) -> str:
    """A ``max_staleness`` flow's batch in words: ``read 3 rows: 3 staged, 0 quarantined;
    5 staged in 2 micro-batches, the oldest 45 s old``; with an apply, ``applied 8 staged
    rows: 5 applied (4 upserted, 1 deleted), 3 merged within the batch, 0 stale, 0
    quarantined; nothing staged``."""
    parts = []
    quarantined = metrics["quarantined"]
    staged = rows_staged(metrics)
    if staged is not None:
        # The stage's quarantined rows are those it read and did not stage; an apply in
        # the same micro-batch quarantines the rest (changes beyond the horizon).
        at_stage = min(quarantined, max(0, metrics["rows_in"] - staged))
        quarantined -= at_stage
        read = f"read {metrics['rows_in']:,} rows"
        parts.append(f"{read}: {staged:,} staged, {at_stage:,} quarantined")
    applied = metrics.get("applied_staged", 0)
    if applied:
        upserted, deleted, stale = metrics["upserted"], metrics["deleted"], metrics["ignored_stale"]
        folded = max(0, applied - upserted - deleted - stale - quarantined)
        parts.append(
            f"applied {applied:,} staged rows: {upserted + deleted:,} applied ({upserted:,} "
            f"upserted, {deleted:,} deleted), {folded:,} merged within the batch, {stale:,} "
            f"stale, {quarantined:,} quarantined"
        )
    parts.append(held(metrics))
    return "; ".join(parts)


def _rate(speed: float | None) -> str:
    """Rows per second, with a decimal below 10 (a tiny batch is not ``0 rows/s``)."""
    if speed is None:
        return "-"
    return f"{speed:,.1f}" if speed < 10 else f"{speed:,.0f}"


def line(progress: FlowProgress, applied: int | None = None) -> str:
    """One plain progress line (without the ``autocdc:`` prefix): the flow's micro-batch
    (as its streaming query numbers them, from 0 over all runs), or an apply of
    ``applied`` staged rows (no micro-batch of its own), then this run's totals."""
    rate = f"{_rate(progress.rows_per_second)} rows/s"
    count = f"{progress.batches} micro-batch{'es' if progress.batches != 1 else ''}"
    what = (
        f"micro-batch {progress.last_batch}"
        if applied is None
        else f"applied {applied:,} staged rows"
    )
    return (
        f"flow {progress.flow}: {what}; this run {count}, "
        f"{progress.rows:,} rows, {rate}; lag {describe_lag(progress.lag)}"
    )


def render(flows: list[FlowProgress]) -> Table:
    """The live table: one row per flow of the run."""
    table = Table("flow", "state", "micro-batch", "rows", "rows/s", "lag", box=None)
    for p in flows:
        table.add_row(
            p.flow,
            p.state,
            "-" if p.last_batch is None else str(p.last_batch),
            f"{p.rows:,}",
            _rate(p.rows_per_second),
            describe_lag(p.lag),
        )
    return table


class Progress:
    """Tracks each flow of a run; ``live`` (default: stdout is a terminal) shows the table,
    else every batch prints a line."""

    def __init__(self, live: bool | None = None, console: Console | None = None) -> None:
        self.flows: dict[str, FlowProgress] = {}
        self.live = sys.stdout.isatty() if live is None else live
        self._display: Live | None = None
        self._console = console

    def __enter__(self) -> Progress:
        if self.live:
            self._display = Live(render([]), console=self._console, auto_refresh=False)
            self._display.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        if self._display is not None:
            self._display.stop()
            self._display = None

    def started(self, flow: str, lag: Lag | None) -> None:
        self.flows[flow] = FlowProgress(flow, lag=lag)
        self._show()

    def batch(self, flow: str, number: int, rows: int, seconds: float, lag: Lag | None) -> None:
        """Micro-batch ``number`` of ``flow`` applied."""
        p = self.flows.setdefault(flow, FlowProgress(flow))
        p.batches, p.last_batch, p.lag = p.batches + 1, number, lag
        p.rows, p.seconds = p.rows + rows, p.seconds + seconds
        self._show()
        if self._display is None:
            print(f"autocdc: {line(p)}", flush=True)

    def staged_applied(self, flow: str, rows: int, seconds: float, lag: Lag | None) -> None:
        """``rows`` staged rows of ``flow`` applied, apart from a micro-batch: its time and
        lag count, not its rows (counted when staged) nor a micro-batch."""
        p = self.flows.setdefault(flow, FlowProgress(flow))
        p.seconds, p.lag = p.seconds + seconds, lag
        self._show()
        if self._display is None:
            print(f"autocdc: {line(p, applied=rows)}", flush=True)

    def stopped(self, flow: str, lag: Lag | None) -> None:
        p = self.flows.setdefault(flow, FlowProgress(flow))
        p.state, p.lag = "done", lag
        self._show()

    def _show(self) -> None:
        if self._display is not None:
            self._display.update(render(list(self.flows.values())), refresh=True)
