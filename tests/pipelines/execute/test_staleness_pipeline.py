"""Pipelines with ``max_staleness`` flows (Python's ``dp`` and SQL's ``MAX STALENESS``):
a triggered run stages each micro-batch and applies them all at its end; the event log
and ``autocdc status`` say what was staged and applied."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from changes import A, B, C, rows
from projects import drop, scd1_rows, scd2_rows, write_project
from reference import fold_scd1, fold_scd2

from autocdc import pipelines as dp
from autocdc.pipelines import cli, errors
from autocdc.pipelines.declare import project
from autocdc.pipelines.execute import pipeline, runner
from autocdc.pipelines.operations import overview, query

FEED = """
from autocdc import pipelines as dp

@dp.temporary_view
def changes():
    return spark.readStream.schema("{feed}").option("maxFilesPerTrigger", 1).json("{data}")

dp.create_streaming_table("latest")
dp.create_auto_cdc_flow(
    target="latest", source="changes", keys=["id"], sequence_by="seq",
    apply_as_deletes="op = 'D'", except_column_list=["op", "seq"], max_staleness="1 hour",
)
"""
HISTORY = """
CREATE OR REFRESH STREAMING TABLE history;
CREATE FLOW history_cdc AS AUTO CDC INTO history
FROM STREAM(changes) KEYS (id)
APPLY AS DELETE WHEN op = 'D' SEQUENCE BY seq COLUMNS * EXCEPT (op, seq)
STORED AS SCD TYPE 2
MAX STALENESS INTERVAL 1 HOUR;
"""


def _both_flows(root: Path, database: str, warehouse: Path) -> Path:
    """A project of the two staging flows (SCD1 in Python, SCD2 in SQL); its spec."""
    files = {"feed.py": FEED, "history.sql": HISTORY}
    return write_project(root, database, files, {"spark.sql.warehouse.dir": str(warehouse)})


def _run(spark, spec: Path) -> runner.Runner:
    ran = pipeline.execute(spark, project.load(spec), runner.Options())
    assert isinstance(ran, pipeline.Ran)
    return ran.runner


def test_a_triggered_run_stages_each_micro_batch_and_applies_them_at_its_end(
    spark, warehouse, tmp_path, new_table, capsys
):
    """Each micro-batch is staged, and says so (not 0 applied, 3 merged: rows that look
    dropped); the run's end applies them, a batch of its own in the lines, the event log
    and ``autocdc history``, with the lag where the source was read to (every file)."""
    database = new_table("stale")
    spec = _both_flows(tmp_path, database, warehouse)
    for i, changes in enumerate((A, B, C), start=1):
        drop(tmp_path, str(i), changes)
        os.utime(tmp_path / "data" / f"{i}.json", (1_000_000 + i, 1_000_000 + i))
    _run(spark, spec)
    assert scd1_rows(spark, f"{database}.latest") == fold_scd1(A + B + C)
    assert scd2_rows(spark, f"{database}.history") == fold_scd2(A + B + C)

    said = [
        re.sub(r"\d+\.\d s \(commit \d+\)$", "T", re.sub(r"oldest \d+ s", "oldest N s", line))
        for line in capsys.readouterr().out.splitlines()
        if line.startswith("autocdc: flow latest: ") and "rows/s" not in line
    ]
    assert said[:4] == [
        "autocdc: flow latest: read 3 rows: 3 staged, 0 quarantined; "
        "3 staged in 1 micro-batch, the oldest N s old; T",
        "autocdc: flow latest: read 3 rows: 3 staged, 0 quarantined; "
        "6 staged in 2 micro-batches, the oldest N s old; T",
        "autocdc: flow latest: read 3 rows: 3 staged, 0 quarantined; "
        "9 staged in 3 micro-batches, the oldest N s old; T",
        # Keys 1 and 3 end deleted (never in the target), key 2's upserts fold into one.
        "autocdc: flow latest: applied 9 staged rows: 2 applied (2 upserted, 0 deleted), "
        "7 merged within the batch, 0 stale, 0 quarantined; nothing staged; T",
    ]

    log = spark.read.format("delta").load(str(tmp_path / "storage" / "event_log"))
    batches = [r for r in log.orderBy("event_time").collect() if r.event_type == "batch"]
    for flow in ("latest", "history_cdc"):
        mine = [r for r in batches if r.flow == flow]
        staged = [r for r in mine if '"stage_id": null' not in r.metrics]
        assert len(staged) == 3  # one a micro-batch, nothing applied
        assert all(r.upserted + r.deleted == 0 for r in staged)
        assert [(r.staged, r.applied_staged) for r in mine] == [(3, 0)] * 3 + [(None, 9)]
        assert '"applied_staged": 9' in mine[-1].metrics  # the run's end applied them
        # The apply stands where the source was read to: every file, no lag left.
        assert (mine[-1].lag_files, mine[-1].lag_bytes, mine[-1].lag_seconds) == (0, 0, None)
        assert mine[-1].stream_batch_id is None
    doc = overview.status(project.load(spec))
    by_flow = {f["flow"]: f for f in doc["flows"]}
    assert by_flow["latest"]["staged"]["rows"] == 0
    assert by_flow["latest"]["staged"]["last_apply_rows"] == 9
    assert by_flow["latest"]["lag"]["files"] == 0

    assert cli.main(["history", "latest", "--spec", str(spec)]) == 0
    header, *table = [line.split() for line in capsys.readouterr().out.splitlines()[1:]]
    assert header[6:10] == ["upserted", "deleted", "staged", "quarantined"]
    # micro-batch; rows in, upserted, deleted, staged, quarantined (after the date and time)
    assert [row[:1] + row[4:9] for row in table] == [
        ["0", "3", "0", "0", "3", "0"],
        ["1", "3", "0", "0", "3", "0"],
        ["2", "3", "0", "0", "3", "0"],
        ["apply", "9", "2", "0", "-", "0"],  # its own row, not a micro-batch's number
    ]
    assert table[-1][-2] == "0"  # lag files
    assert cli.main(["history", "latest", "--spec", str(spec), "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)["batches"]
    assert [(b["staged"], b["applied_staged"]) for b in listed] == [(3, 0)] * 3 + [(None, 9)]


def test_autocdc_apply_applies_what_is_staged(spark, warehouse, tmp_path, new_table):
    """Staged by the engine (as a continuous run between applies), applied by the
    ``apply`` command's runner; a dataset it does not know is refused."""
    database = new_table("stale_apply")
    spec = write_project(
        tmp_path, database, {"feed.py": FEED}, {"spark.sql.warehouse.dir": str(warehouse)}
    )
    drop(tmp_path, "1", A)
    ran = _run(spark, spec)
    engine = ran.graph.kinds["latest"].engine
    engine.stage(spark.createDataFrame(rows(B), "id INT, a STRING, b INT, op STRING, seq BIGINT"))
    assert engine.staged_status(spark).rows == len(B)
    assert {r.id: (r.a, r.b) for r in engine.current(spark).collect()} == fold_scd1(A + B)
    with pytest.raises(errors.UnknownDatasetError):
        ran.apply_all({"nope"})
    ran.apply_all({"latest"})
    assert scd1_rows(spark, f"{database}.latest") == fold_scd1(A + B)
    assert engine.staged_status(spark).rows == 0


def test_apply_is_a_command():
    args = cli._parser().parse_args(["apply", "latest", "history"])
    assert (args.command, args.datasets) == ("apply", ["latest", "history"])


def test_pipeline_users_read_staged_changes_without_declaring_the_flow_again(
    spark, warehouse, tmp_path, new_table, capsys
):
    """Between applies (as in a continuous run), ``dp.current``, the
    ``<table>__autocdc_current`` views and ``autocdc query --fresh`` answer with the
    staged changes merged in, from the project's own Python and SQL definitions."""
    database = new_table("stale_read")
    spec = _both_flows(tmp_path, database, warehouse)
    drop(tmp_path, "1", A)
    ran = _run(spark, spec)
    for flow in ("latest", "history_cdc"):
        engine = ran.graph.kinds[flow].engine
        engine.stage(
            spark.createDataFrame(rows(B), "id INT, a STRING, b INT, op STRING, seq BIGINT")
        )
    assert scd1_rows(spark, f"{database}.latest") == fold_scd1(A)  # the table: stale
    live = {r.id: (r.a, r.b) for r in dp.current("latest", spec, spark).collect()}
    assert live == fold_scd1(A + B)
    opened = {(k, v) for k, v, _start, end in fold_scd2(A + B) if end is None}
    assert {(r.id, (r.a, r.b)) for r in dp.current("history", spec, spark).collect()} == opened
    views = dp.current_views(spec, spark, fresh=True)
    try:
        assert sorted(views) == sorted(
            ["latest__autocdc_current", "latest", "history__autocdc_current", "history"]
        )
        history = {
            (r.id, (r.a, r.b), r["__START_AT"], r["__END_AT"])
            for r in spark.table("history").collect()
        }
        assert history == fold_scd2(A + B)
        args = cli._parser().parse_args(
            ["query", "--json", "--fresh", "--spec", str(spec), "SELECT id, a, b FROM latest"]
        )
        capsys.readouterr()
        assert query.main_query(args, project.load(spec), spark) == 0
        printed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        assert {r["id"]: (r["a"], r["b"]) for r in printed} == fold_scd1(A + B)
    finally:
        for view in views:
            spark.catalog.dropTempView(view)
    with pytest.raises(errors.NoSuchDatasetError):
        dp.current("nope", spec, spark)
