"""Replaying a flow from a position of its Delta source, without a full refresh: after a
bad transformation is fixed, each replay leaves the targets equal to the reference fold of
every change they were given (SCD type 2 history included, and unchanged by a replay of
changes it holds); a replay that cannot be done is refused before anything is written;
the event log records each replay. A WATERMARK extraction is replayed from a watermark."""

from __future__ import annotations

import json
import sqlite3
from datetime import datetime, timezone
from pathlib import Path

import pytest
from changes import EVERYTHING, rows
from delta.tables import DeltaTable
from projects import FEED, run, scd1_rows, scd2_rows, write_project
from pyspark.sql import functions as F
from reference import Change, fold_scd1, fold_scd2

from autocdc import pipelines as dp
from autocdc.pipelines.declare import project
from autocdc.pipelines.errors import (
    ReplayBeyondRetentionError,
    ReplayPositionError,
    ReplayUnknownFlowError,
    ReplayUnsupportedError,
)
from autocdc.pipelines.execute import eventlog, replay

FLOWS = """
from autocdc import pipelines as dp

@dp.temporary_view
def changes():
    return spark.readStream.table("{db}.feed")FILTER

dp.create_streaming_table("latest")
dp.create_auto_cdc_flow(
    target="latest", source="changes", keys=["id"], sequence_by="seq",
    apply_as_deletes="op = 'D'", except_column_list=["op", "seq"],
)
dp.create_streaming_table("history")
dp.create_auto_cdc_flow(
    target="history", name="history_cdc", source="changes", keys=["id"], sequence_by="seq",
    apply_as_deletes="op = 'D'", except_column_list=["op", "seq"], stored_as_scd_type=2,
)

@dp.table
def raw():
    return spark.readStream.table("{db}.feed")
"""
BUG = '.where("id % 2 = 1")'  # a bad transformation: drops the changes of even keys
# The feed's commits: version 0 creates the table, versions 1..3 append these.
COMMITS = [EVERYTHING[:5], EVERYTHING[5:10], EVERYTHING[10:]]


def buggy(changes: list[Change]) -> list[Change]:
    return [c for c in changes if c.key % 2 == 1]


@pytest.fixture
def feed(spark, tmp_path, new_table):
    """A project over a Delta table of changes (three commits), run once with the bad
    transformation, then fixed: (its spec, its database)."""
    database = new_table("replay")
    spark.sql(f"CREATE DATABASE IF NOT EXISTS {database}")
    spark.sql(f"CREATE TABLE {database}.feed ({FEED}) USING delta LOCATION '{tmp_path / 'feed'}'")
    for changes in COMMITS:
        frame = spark.createDataFrame(rows(changes), FEED)
        frame.write.format("delta").mode("append").saveAsTable(f"{database}.feed")
    root = tmp_path / "project"
    spec = write_project(root, database, {"flows.py": FLOWS.replace("FILTER", BUG)})
    run(spark, spec)
    assert scd1_rows(spark, f"{database}.latest") == fold_scd1(buggy(EVERYTHING))
    write_project(root, database, {"flows.py": FLOWS.replace("FILTER", "")})
    return spec, database


def replays(spark, spec: Path) -> list[tuple[str, dict]]:
    """The replay events of the project: (flow, the source's new offset)."""
    events = eventlog.read(spark, project.load(spec)).where("event_type = 'replay'")
    found = events.orderBy("event_time").collect()
    return [(e.flow, json.loads(e.source_position)[0]["offset"]) for e in found]


def test_replays_from_several_positions_equal_the_reference_fold(spark, feed):
    """Each flow replayed from several positions (versions, a time, through ``dp.run``
    too): each target is the fold of the changes applied so far, the buggy run's and
    every replayed commit's; the SCD type 2 history stays as it is when the replayed
    changes are ones it holds."""
    spec, database = feed
    latest, history = f"{database}.latest", f"{database}.history"
    given = buggy(EVERYTHING)
    for version in (3, 2):
        run(spark, spec, replay_from=replay.parse(f"latest=version:{version}"))
        given += [c for commit in COMMITS[version - 1 :] for c in commit]
        assert scd1_rows(spark, latest) == fold_scd1(given)
    dp.run(spec, spark, replay_from="latest=version:0")
    assert scd1_rows(spark, latest) == fold_scd1(EVERYTHING)

    assert scd2_rows(spark, history) == fold_scd2(buggy(EVERYTHING))  # not replayed yet
    history_of_feed = DeltaTable.forName(spark, f"{database}.feed").history()
    millis = history_of_feed.where("version = 1").select(F.unix_millis("timestamp")).first()[0]
    at = datetime.fromtimestamp(millis / 1000, timezone.utc).isoformat()  # as a user reads it
    run(spark, spec, replay_from=replay.parse(f"history_cdc=timestamp:{at}"))
    assert scd2_rows(spark, history) == fold_scd2(EVERYTHING)
    run(spark, spec, replay_from=replay.parse("history_cdc=version:2"))  # changes it holds
    assert scd2_rows(spark, history) == fold_scd2(EVERYTHING)
    assert scd1_rows(spark, latest) == fold_scd1(EVERYTHING)

    versions = [(flow, offset["reservoirVersion"]) for flow, offset in replays(spark, spec)]
    expected = [("latest", 3), ("latest", 2), ("latest", 0), ("history_cdc", 1)]
    assert versions == [*expected, ("history_cdc", 2)]


def _state(spark, root: Path, database: str) -> tuple:
    """What a run writes: the targets' Delta versions and the flows' checkpoint logs."""
    versions = [
        spark.sql(f"DESCRIBE HISTORY {database}.{t}").first().version for t in ("latest", "raw")
    ]
    logs = sorted(str(p.relative_to(root)) for p in (root / "storage").rglob("*") if p.is_file())
    return versions, [p for p in logs if "event_log" not in p]


def test_a_replay_that_cannot_be_done_is_refused_before_anything_is_written(spark, feed):
    """Beyond what the source retains (an OPTIMIZE, then VACUUM, removed the files the
    first versions added), a flow the pipeline lacks, an append flow: each refused with
    its class, the targets and the checkpoints as they were, no replay logged."""
    spec, database = feed
    root = spec.parent
    table = root.parent / "feed"
    spark.sql(f"OPTIMIZE {database}.feed")  # version 4: files rewritten, no data change
    optimized = (table / "_delta_log" / f"{4:020d}.json").read_text().splitlines()
    for action in map(json.loads, optimized):
        if "remove" in action:  # what VACUUM deletes once the retention has passed
            (table / action["remove"]["path"]).unlink()
    before = _state(spark, root, database)
    cases = [
        ("latest=version:2", ReplayBeyondRetentionError),
        ("nothing=version:2", ReplayUnknownFlowError),
        ("raw=version:2", ReplayUnsupportedError),
    ]
    for given, refusal in cases:
        with pytest.raises(refusal) as refused:
            run(spark, spec, replay_from=replay.parse(given))
        assert _state(spark, root, database) == before
    assert refused.value.params["why"].startswith("it is an append flow")
    with pytest.raises(ReplayBeyondRetentionError) as refused:
        run(spark, spec, replay_from=replay.parse("latest=version:3"))
    assert refused.value.params["oldest"].startswith("version:4 ")
    assert replays(spark, spec) == []
    run(spark, spec, replay_from=replay.parse("latest=version:4"))  # the oldest it holds
    assert scd1_rows(spark, f"{database}.latest") == fold_scd1(buggy(EVERYTHING))


EXTRACTED = """
from autocdc import pipelines as dp

dp.create_extraction_source(name="items_src", url="URL", table="items", cdc_order=["updated_at"])
dp.create_streaming_table("latest")
dp.create_auto_cdc_flow(target="latest", source="items_src", keys=["id"], sequence_by="updated_at")
dp.create_streaming_table("history")
dp.create_auto_cdc_flow(target="history", name="history_flow", source="items_src", keys=["id"],
                        sequence_by="updated_at", stored_as_scd_type=2)
"""


def test_an_extraction_replayed_from_a_watermark_reads_the_rows_since_again(
    spark, tmp_path, new_table
):
    """A WATERMARK extraction (SQLite through JDBC) replayed from the start and from a
    value: the rows changed since are read again, as the table holds them now, and
    change nothing: SCD type 1 is the table, SCD type 2 history is as it was. A
    watermark ahead of the flow's is refused."""
    db = tmp_path / "shop.db"

    def execute(*statements: str) -> None:
        with sqlite3.connect(db) as conn:
            for statement in statements:
                conn.execute(statement)

    execute(
        "CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT, updated_at TEXT)",
        "INSERT INTO items VALUES (1, 'a', '2026-01-01 07:00:00'), "
        "(2, 'b', '2026-01-01 08:00:00'), (3, 'c', '2026-01-01 09:00:00')",
    )
    database = new_table("replay_x")
    url = f"jdbc:sqlite:{db}"
    spec = write_project(tmp_path / "p", database, {"f.py": EXTRACTED.replace("URL", url)})
    run(spark, spec)
    execute("UPDATE items SET name = 'b2', updated_at = '2026-01-01 10:00:00' WHERE id = 2")
    run(spark, spec)
    table = {(1, "a"), (2, "b2"), (3, "c")}

    def latest() -> set:
        return {(r.id, r.name) for r in spark.table(f"{database}.latest").collect()}

    history = sorted(map(tuple, spark.table(f"{database}.history").collect()), key=repr)
    assert latest() == table and len(history) == 4  # 2's two versions
    given = [("latest", None), ("history_flow", "2026-01-01 08:30:00")]
    for flow, value in given:
        position = json.dumps({"updated_at": value})
        run(spark, spec, replay_from=replay.parse(f"{flow}=watermark:{position}"))
        assert latest() == table
        after = sorted(map(tuple, spark.table(f"{database}.history").collect()), key=repr)
        assert after == history
    with pytest.raises(ReplayPositionError):
        run(
            spark,
            spec,
            replay_from=replay.parse('latest=watermark:{"updated_at": "2027-01-01 00:00:00"}'),
        )
    assert [(flow, offset["updated_at"]) for flow, offset in replays(spark, spec)] == given
