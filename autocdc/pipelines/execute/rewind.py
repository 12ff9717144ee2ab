"""Rewind a run's flow to a position of its source (:mod:`autocdc.pipelines.execute.replay`),
before anything is written.

The flow is found and its kind checked (:func:`kinds.unreplayable`), the position checked
against what its source still holds; a position beyond it is refused, naming the oldest
one it holds. Then the replay is logged (a ``replay`` event whose ``source_position`` is
the new offset), and the flow's checkpoint moved there (:func:`replay.append_batch`; a
WATERMARK extraction's checkpoint file is replaced whole).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING

from pyspark.sql import SparkSession

from autocdc.pipelines.declare.project import Project
from autocdc.pipelines.declare.registry import CdcFlow, Flow
from autocdc.pipelines.errors import (
    ReplayNotStartedError,
    ReplayUnknownFlowError,
    ReplayUnsupportedError,
)
from autocdc.pipelines.execute import position as pos
from autocdc.pipelines.execute.checkpoint import CheckpointFile
from autocdc.pipelines.execute.eventlog import EventLog
from autocdc.pipelines.execute.kinds import unreplayable
from autocdc.pipelines.execute.replay import Replay, append_batch, delta, finish, kafka, watermark
from autocdc.sources import extract, kafkaclient

if TYPE_CHECKING:
    from autocdc.pipelines.execute import graph as g


def _find(flows: dict[str, list[Flow]], name: str) -> tuple[Flow, str]:
    """The flow named ``name`` and its dataset."""
    for dataset, into in flows.items():
        for flow in into:
            if flow.name == name:
                return flow, dataset
    known = sorted(f.name for into in flows.values() for f in into)
    raise ReplayUnknownFlowError(flow=name, known=", ".join(known) or "none")


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
    why = unreplayable(flow)
    if why is None and flow.extraction is None:  # a change flow: the others have a why
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
    why = unreplayable(flow)
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
        offset, said = delta(replay, dataset, source, ends[0])
    else:
        client = kafkaclient.askable(source.get("client"))
        if client is None:
            why = "its Kafka source's credentials are written as values, so its broker "
            why += "cannot be asked what it retains (give them as placeholders)"
            raise ReplayUnsupportedError(flow=flow.name, why=why, dataset=dataset)
        offset, said = kafka(replay, dataset, source, ends[0], client)
    message = f"flow {flow.name}: replay from {replay.position} ({json.dumps(said)})"
    events.write(
        "replay",
        flow=flow.name,
        target=target,
        position=pos.position(found, [offset]),
        message=message,
    )
    append_batch(checkpoint, batch, [offset])
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
    moved, said = watermark(replay, source, stored)
    offset = json.loads(extract.dumps(moved, source.name))
    events.write(
        "replay",
        flow=flow.name,
        target=target,
        position=[{"kind": "extraction", "path": None, "source": source.name, "offset": offset}],
        message=f"flow {flow.name}: replay from {replay.position} ({extract.dumps(said)})",
    )
    store.write(source, moved, rows=0, batches=0)
