"""Replay one flow from a position of its source, without a full refresh.

``autocdc run --replay-from FLOW=KIND:VALUE`` (``dp.run(..., replay_from=...)``) rewinds
one AUTO CDC flow's read of its source, then the run goes on as any run: the flow reads
again from there, and its target takes the changes again. The target is not truncated:
a change it holds already is a no-op in the fold (docs/semantics.md), so the target ends
as the fold of every change it was given, the replayed ones included, whatever the
position.

Before anything is written the position is checked against what the source still holds
(:mod:`autocdc.pipelines.execute.rewind`); a position beyond it is refused, naming the
oldest one it holds. Then the replay is logged (a ``replay`` event whose
``source_position`` is the new offset), and the flow's checkpoint gets one more
micro-batch, empty and committed, that ends at the new offset, so Spark's next batch
starts there. The checkpoint keeps its history (its id, its offset and commit logs).

The two files of that batch (its offsets, then its commit) are written from a note in
the checkpoint folder (``autocdc-replay.json``), itself written first and removed last:
a run killed between them leaves the note, and the flow's next start writes them again
(:func:`finish`) before Spark reads the checkpoint.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pyspark.sql import SparkSession

from autocdc.pipelines.declare.project import Project
from autocdc.pipelines.declare.registry import CdcFlow, Flow, QueryFlow, SnapshotFlow
from autocdc.pipelines.errors import (
    ReplayNotStartedError,
    ReplayPositionError,
    ReplayUnknownFlowError,
    ReplayUnsupportedError,
)
from autocdc.pipelines.execute import position as pos
from autocdc.pipelines.execute import rewind
from autocdc.pipelines.execute.checkpoint import CheckpointFile, write_atomically
from autocdc.pipelines.execute.eventlog import EventLog
from autocdc.sources import extract, kafkaclient
from autocdc.sources import pgoutput as pg
from autocdc.sources.extract import Strategy

if TYPE_CHECKING:  # the graph holds each flow's kind, whose start finishes a replay
    from autocdc.pipelines.execute import graph as g

NOTE = "autocdc-replay.json"
KINDS = ("version", "timestamp", "offsets", "lsn", "watermark")
_LSN = re.compile(r"[0-9A-Fa-f]{1,8}/[0-9A-Fa-f]{1,8}")


@dataclass(frozen=True)
class Replay:
    """One flow, one position: ``kind`` (``version``, ``timestamp``, ``offsets``, ``lsn``
    or ``watermark``) and its ``value`` (an int, an aware datetime, Kafka offsets or
    ``"earliest"``, an LSN as a number, a watermark's values by column)."""

    flow: str
    kind: str
    value: Any
    given: str  # as the user wrote it

    @property
    def position(self) -> str:
        return self.given.partition("=")[2].strip()

    def refused(self, problem: str) -> ReplayPositionError:
        return ReplayPositionError(given=self.given, problem=problem)


def parse(given: str) -> Replay:
    """``FLOW=KIND:VALUE`` -> a :class:`Replay`; the value is checked for its kind here
    (whether the flow's source has such positions, when the run begins).

    >>> parse("orders=version:12").value
    12
    >>> parse('events=offsets:{"t":{"0":5}}').value
    {'t': {'0': 5}}
    """
    flow, _, position = given.partition("=")
    kind, _, text = position.partition(":")
    flow, kind, text = flow.strip(), kind.strip().lower(), text.strip()
    replay = Replay(flow, kind, None, given)
    if not flow or not text:
        raise replay.refused("it names no flow or no position")
    if kind not in KINDS:
        raise replay.refused(f"{kind!r} is not a kind of position ({', '.join(KINDS)})")
    return Replay(flow, kind, _value(replay, text), given)


def _value(replay: Replay, text: str) -> Any:
    if replay.kind == "version":
        if not text.isdigit():
            raise replay.refused(f"a version is a number from 0 up, not {text!r}")
        return int(text)
    if replay.kind == "lsn":
        if not _LSN.fullmatch(text):
            raise replay.refused(
                f"an LSN is written as PostgreSQL prints it (16/B374D848), not {text!r}"
            )
        return pg.parse_lsn(text)
    if replay.kind == "timestamp":
        try:
            at = datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            raise replay.refused(f"{text!r} is not an ISO 8601 time") from None
        return at if at.tzinfo else at.replace(tzinfo=timezone.utc)  # no zone: UTC
    if replay.kind == "watermark":
        try:
            values = json.loads(text, parse_float=Decimal)  # a decimal kept exact
        except json.JSONDecodeError:
            values = None
        if not isinstance(values, dict) or not all(
            isinstance(v, str | int | Decimal | None) for v in values.values()
        ):
            raise replay.refused('a watermark is JSON, {"cdc_order column": value}')
        return values
    if text == rewind.EARLIEST:
        return text
    try:
        offsets = json.loads(text)
        valid = isinstance(offsets, dict) and all(
            isinstance(parts, dict)
            and all(str(p).isdigit() and isinstance(o, int) and o >= 0 for p, o in parts.items())
            for parts in offsets.values()
        )
    except json.JSONDecodeError:
        valid = False
    if not valid:
        raise replay.refused('offsets are JSON, {"topic": {"partition": offset}}, or earliest')
    return offsets


def _find(flows: dict[str, list[Flow]], name: str) -> tuple[Flow, str]:
    """The flow named ``name`` and its dataset."""
    for dataset, into in flows.items():
        for flow in into:
            if flow.name == name:
                return flow, dataset
    known = sorted(f.name for into in flows.values() for f in into)
    raise ReplayUnknownFlowError(flow=name, known=", ".join(known) or "none")


def _why_not(flow: Flow) -> str | None:
    """Why the kind of ``flow`` cannot be replayed (None: it can)."""
    if isinstance(flow, SnapshotFlow):
        return "it is a snapshot flow (each run reads its whole source)"
    if isinstance(flow, QueryFlow):
        return "it is an append flow: the rows it read again would be appended twice"
    assert isinstance(flow, CdcFlow)
    if flow.extraction is not None and flow.extraction.strategy is not Strategy.WATERMARK:
        strategy = flow.extraction.strategy.value
        return f"its source is a {strategy} extraction (only a WATERMARK one has positions)"
    if flow.once:
        return "it is a once flow (a full refresh of its target runs it again)"
    return None


def refuse_early(project: Project, replay: Replay) -> None:
    """Raise, before Spark starts, what :func:`rewind_flow` would raise once it has: the
    flow is unknown, its kind has no positions, or it reads files (its view one plain
    streaming read of them). What the declarations alone cannot tell is left to the run
    (:mod:`autocdc.pipelines.declare.sparkless`)."""
    from autocdc.pipelines.declare import sparkless

    declared = sparkless.load(project)
    if declared is None:
        return
    by_target: dict[str, list[Flow]] = {}
    for flow in declared.flows.values():
        by_target.setdefault(flow.target, []).append(flow)
    flow, dataset = _find(by_target, replay.flow)
    why = _why_not(flow)
    if why is None and isinstance(flow, CdcFlow) and flow.extraction is None:
        read = sparkless.streaming_read(declared, flow.source)
        if read is not None and read.kind not in ("delta", "kafka"):
            why = (
                f"it reads {'files' if read.kind == 'files' else 'a source'} "
                f"({read.format}), which have no positions: land them "
                "in a streaming table (a bronze Delta table) and have the flow read that, "
                "then replay it by version (docs/operations.md)"
            )
    if why is not None:
        raise ReplayUnsupportedError(flow=flow.name, why=why, dataset=dataset)


def rewind_flow(
    spark: SparkSession,
    project: Project,
    graph: g.Graph,
    replay: Replay,
    events: EventLog,
    qualify: Callable[[str], str],
    resetting: set[str],
) -> str:
    """Check ``replay`` against the flow's source and rewind the flow's checkpoint to it,
    logged; return the flow's dataset. Raises, with nothing written, when it cannot be
    done. ``qualify`` gives a dataset's table, ``resetting`` are the datasets the run
    fully refreshes; the pipeline's temporary views are defined."""
    flow, dataset = _find(graph.flows, replay.flow)
    target = qualify(dataset)
    why = _why_not(flow)
    if why is not None:
        raise ReplayUnsupportedError(flow=flow.name, why=why, dataset=dataset)
    if dataset in resetting:
        why = f" (this run fully refreshes `{dataset}`: it reads everything anyway)"
        raise ReplayNotStartedError(flow=flow.name, why=why)
    checkpoint = project.checkpoint(flow.name)
    if flow.extraction is not None:
        _rewind_extraction(replay, flow, dataset, target, CheckpointFile(checkpoint), events)
        return dataset
    finish(checkpoint)
    df = graph.kinds[flow.name].build(spark)
    assert df is not None
    found = pos.sources(df, project.root)
    if len(found) != 1 or found[0]["kind"] not in ("delta", "kafka"):
        kinds = ", ".join(s["kind"] for s in found) or "none"
        why = f"it reads {len(found)} streaming source(s) ({kinds}), not one Delta or Kafka one"
        raise ReplayUnsupportedError(flow=flow.name, why=why, dataset=dataset)
    source = found[0]
    batch = pos.committed(checkpoint)
    ends = pos.offsets(checkpoint, batch)
    if batch is None or not ends or ends[0] is None:
        raise ReplayNotStartedError(flow=flow.name, why="")
    if source["kind"] == "delta":
        if source["path"] is None:
            why = "its Delta source's location is unknown"
            raise ReplayUnsupportedError(flow=flow.name, why=why, dataset=dataset)
        offset, said = rewind.delta(replay, dataset, source, ends[0])
    else:
        client = kafkaclient.askable(source.get("client"))
        if client is None:
            why = "its Kafka source's credentials are written as values, so its broker "
            why += "cannot be asked what it retains (give them as placeholders)"
            raise ReplayUnsupportedError(flow=flow.name, why=why, dataset=dataset)
        offset, said = rewind.kafka(replay, dataset, source, ends[0], client)
    message = f"flow {flow.name}: replay from {replay.position} ({json.dumps(said)})"
    events.write(
        "replay",
        flow=flow.name,
        target=target,
        position=pos.position(found, [offset]),
        message=message,
    )
    _append_batch(checkpoint, batch, [offset])
    return dataset


def _rewind_extraction(
    replay: Replay,
    flow: CdcFlow,
    dataset: str,
    target: str,
    store: CheckpointFile,
    events: EventLog,
) -> None:
    """Move a WATERMARK extraction flow's checkpoint back (one file, replaced whole)."""
    source = flow.extraction
    assert source is not None
    stored = store.read(source, flow.name, dataset)
    if stored is None:
        raise ReplayNotStartedError(flow=flow.name, why="")
    moved, said = rewind.watermark(replay, source, stored)
    offset = json.loads(extract.dumps(moved, source.name))
    events.write(
        "replay",
        flow=flow.name,
        target=target,
        position=[{"kind": "extraction", "path": None, "source": source.name, "offset": offset}],
        message=f"flow {flow.name}: replay from {replay.position} ({extract.dumps(said)})",
    )
    store.write(source, moved, rows=0, batches=0)


def _append_batch(checkpoint: Path, batch: int, ends: list[dict[str, Any]]) -> None:
    """Note, then write, micro-batch ``batch + 1``: committed, ending at ``ends``."""
    head = (checkpoint / "offsets" / str(batch)).read_text().splitlines()[:2]  # version, conf
    offsets = "\n".join([*head, *(json.dumps(e, separators=(",", ":")) for e in ends)])
    commit = (checkpoint / "commits" / str(batch)).read_text()
    note = {"batch": batch + 1, "offsets": offsets, "commit": commit}
    write_atomically(checkpoint / NOTE, json.dumps(note))
    finish(checkpoint)


def finish(checkpoint: Path) -> None:
    """Write the micro-batch a replay noted in ``checkpoint`` (if any), then drop the note:
    again and again alike, so a kill anywhere in it is made good by the next start."""
    note = checkpoint / NOTE
    try:
        noted = json.loads(note.read_text())
    except FileNotFoundError:
        return
    for log, text in (("offsets", noted["offsets"]), ("commits", noted["commit"])):
        written = checkpoint / log / str(noted["batch"])
        written.with_name(f".{written.name}.crc").unlink(missing_ok=True)  # Hadoop's checksum
        write_atomically(written, text)
    note.unlink()
