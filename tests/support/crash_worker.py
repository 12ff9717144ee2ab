"""Subprocess for the kill tests: apply one batch to a flow, maybe dying on the way.

Usage: python crash_worker.py WAREHOUSE TARGET ROWS_JSON SCD_TYPE  (env AUTOCDC_TEST_CRASH_AT;
AUTOCDC_TEST_COLLECT=1 also runs ``collect_tombstones`` after every batch)

ROWS_JSON is one batch (a list of rows) or ``{"batches": [batch, ...]}``: several batches
applied in turn by one process, the crash point armed for the last one only (with
``"fold_every": n``, the pending state folded every n batches). A ``"before":
{"target": ..., "scd_type": ..., "batches": [...]}`` entry is applied in full first, to its
own target: one process (one Spark start) then serves two kill chains. ``{"snapshot": rows}``
instead runs an ``AutoCdcSnapshotFlow`` over a view of those rows (id, a, b: a source
numbered by run), the crash point armed.

``{"staged": {"batches": [batch, ...], "apply": bool}}``: a flow with ``max_staleness``
stages the batches in turn (the crash point armed for the last), then applies what is
staged if ``apply`` (the crash point armed there too).

``{"two_flows": {"targets": {name: scd_type}, "first": batch, "A": batch, "B": batch}}``:
two flows into each target (:func:`two_flows`: A full rows, B partial upserts; with
``"groups": true`` each its own sequence group); A's
``first`` batch is applied to every target, then every target's A and B batches run at
once, each in a thread of its own session, with the crash point armed for all of them.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Callable

from changes import feed_flow
from pyspark.sql import SparkSession
from sparkconf import SUBPROCESS_CONF

import autocdc
from autocdc.engine import commit
from autocdc.engine.faults import CRASH_ENV

SCHEMA = "id int, a string, b int, op string, seq long"
# The partial producer: sets b and c (those its row's `cols` lists; NULL: both), on its
# own sequence column, deleting with its own condition.
PARTIAL_SCHEMA = "id int, b int, c string, kind string, n long, cols array<string>"


# Sequence groups: A orders (a, b) by `seq`, a bigint; B orders c by its `n` read as a
# timestamp (another clock, of another type); B's b is not its group's, so not stored.
GROUPS = {"a": ["a", "b"], "b": ["c"]}


def two_flows(target: str, scd_type: int, groups: bool = False) -> dict[str, autocdc.AutoCdcFlow]:
    """Two producers into one target: A's full rows, B's partial upserts (``groups``:
    each its own sequence group, SCD type 1)."""
    a = {"sequence_by": "seq", "apply_as_deletes": "op = 'D'", "except_column_list": ["op", "seq"]}
    b = {
        "sequence_by": "timestamp_seconds(n)" if groups else "n",
        "apply_as_deletes": "kind = 'D'",
        "except_column_list": ["kind", "n"],
        "columns_to_update": "cols",
    }
    if groups:
        a |= {"sequence_groups": GROUPS, "sequence_group": "a"}
        b |= {"sequence_groups": GROUPS, "sequence_group": "b"}
    else:
        a |= {"stored_as_scd_type": scd_type, "partial_target": True}
        b |= {"stored_as_scd_type": scd_type}
    return {
        flow: autocdc.AutoCdcFlow(target=target, name=f"{target}_{flow.lower()}", keys=["id"], **kw)
        for flow, kw in (("A", a), ("B", b))
    }


def run_two_flows(spark: SparkSession, plan: dict, crash_at: str | None) -> None:
    """A's first batch into every target, then all A and B batches at once (armed)."""
    schemas = {"A": SCHEMA, "B": PARTIAL_SCHEMA}
    targets = {name: int(scd) for name, scd in plan["targets"].items()}
    groups = bool(plan.get("groups"))
    for target, scd_type in targets.items():
        two_flows(target, scd_type, groups)["A"].apply(spark.createDataFrame(plan["first"], SCHEMA))
    if crash_at:
        os.environ[CRASH_ENV] = crash_at

    def run(target: str, scd_type: int, flow: str) -> None:
        session = spark.newSession()
        batch = session.createDataFrame([tuple(r) for r in plan[flow]], schemas[flow])
        retry_lost(lambda: two_flows(target, scd_type, groups)[flow].apply(batch))

    threads = [
        threading.Thread(target=run, args=(target, scd_type, flow))
        for target, scd_type in targets.items()
        for flow in ("A", "B")
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


SNAPSHOT_SCHEMA = "id int, a string, b int"


def main(warehouse: str, target: str, rows_json: str, scd_type: str) -> None:
    spark = autocdc.spark_session(warehouse=warehouse, conf=SUBPROCESS_CONF)
    payload = json.loads(rows_json)
    if isinstance(payload, dict) and "two_flows" in payload:
        run_two_flows(spark, payload["two_flows"], os.environ.pop(CRASH_ENV, None))
        return
    crash_at = os.environ.pop(CRASH_ENV, None)
    if isinstance(payload, dict) and "staged" in payload:
        run_staged(spark, target, int(scd_type), payload["staged"], crash_at)
        return
    if isinstance(payload, dict) and "snapshot" in payload:
        run_snapshot(spark, target, int(scd_type), payload["snapshot"], crash_at)
        return
    batches = payload["batches"] if isinstance(payload, dict) else [payload]
    if isinstance(payload, dict) and "fold_every" in payload:
        commit.FOLD_EVERY = int(payload["fold_every"])
    before = payload.get("before") if isinstance(payload, dict) else None
    if before:
        apply_all(spark, before["target"], int(before["scd_type"]), before["batches"])
    apply_all(spark, target, int(scd_type), batches, crash_at)


def apply_all(
    spark: SparkSession,
    target: str,
    scd_type: int,
    batches: list[list[list]],
    crash_at: str | None = None,
) -> None:
    """Apply ``batches`` in turn to ``target``, the crash point armed for the last one."""
    flow = feed_flow(target, scd_type)
    for i, batch in enumerate(batches):
        if crash_at and i == len(batches) - 1:
            os.environ[CRASH_ENV] = crash_at
        df = spark.createDataFrame([tuple(r) for r in batch], SCHEMA)
        # A writer that keeps losing to another gives up with nothing lost; the remedy
        # its error names is to apply the batch again.
        retry_lost(lambda df=df: flow.apply(df))
        if os.environ.get("AUTOCDC_TEST_COLLECT"):
            retry_lost(lambda: flow.collect_tombstones(spark))


def staging_flow(target: str, scd_type: int) -> autocdc.AutoCdcFlow:
    return feed_flow(target, scd_type, max_staleness="1 day")


def run_staged(
    spark: SparkSession, target: str, scd_type: int, plan: dict, crash_at: str | None
) -> None:
    """Stage ``plan["batches"]`` in turn (armed for the last), then apply if ``apply``."""
    flow = staging_flow(target, scd_type)
    batches = plan["batches"]
    for i, batch in enumerate(batches):
        if crash_at and i == len(batches) - 1:
            os.environ[CRASH_ENV] = crash_at
        flow.stage(spark.createDataFrame([tuple(r) for r in batch], SCHEMA))
    if plan.get("apply"):
        if crash_at:
            os.environ[CRASH_ENV] = crash_at
        flow.apply_staged(spark)


def run_snapshot(
    spark: SparkSession, target: str, scd_type: int, rows: list[list], crash_at: str | None
) -> None:
    """Process a view of ``rows`` as the next snapshot of ``target`` (keys: id)."""
    view = spark.createDataFrame([tuple(r) for r in rows], SNAPSHOT_SCHEMA)
    view.createOrReplaceTempView("snapshot_source")
    if crash_at:
        os.environ[CRASH_ENV] = crash_at
    flow = autocdc.AutoCdcSnapshotFlow(target=target, keys=["id"], stored_as_scd_type=scd_type)
    flow.run(spark, "snapshot_source")


def retry_lost(action: Callable[[], object]) -> None:
    for _ in range(3):
        try:
            action()
            return
        except autocdc.ConcurrentWriteError:
            continue
    action()


if __name__ == "__main__":
    main(*sys.argv[1:5])
