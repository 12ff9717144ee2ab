"""Pipeline projects: spec + Python (pyspark's and autocdc's ``dp``) + SQL definitions,
run several times with new change files in between, checked against the reference fold.

Each test's project has its own database, so tests share the session but not tables.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from changes import A, B, C
from delta.tables import DeltaTable
from processes import ROOT
from projects import (
    PYSPARK_SCD1,
    SQL_SCD2,
    drop,
    run,
    scd1_rows,
    scd2_rows,
    write_project,
)
from pyspark.sql import functions as F
from reference import DELETE, UPSERT, Change, fold_scd1, fold_scd2

from autocdc import pipelines as dp
from autocdc.engine.errors import (
    DefinitionChangedError,
    TrackHistoryWithScd1Error,
    UnknownColumnError,
    UnknownConnectorError,
)
from autocdc.pipelines import cli, errors
from autocdc.pipelines.declare import project, registry, scaffold
from autocdc.pipelines.execute import graph, interrupt, kinds, lock, pipeline, runner
from autocdc.pipelines.operations import overview
from autocdc.runtime import log_file
from autocdc.sources.errors import TableNotFoundError


@pytest.fixture
def database(new_table) -> str:
    return new_table("pipe")


def test_python_and_sql_flows_over_several_runs(spark, tmp_path, database):
    """pyspark's own dp (SCD1) and SQL (SCD2, a materialized view), new files between
    runs: each target is the reference fold of every file so far. The targets are
    created with their dataset's clustering and table properties."""
    clustered = 'dp.create_streaming_table("latest", cluster_by=["id"])'
    files = {
        "feed.py": PYSPARK_SCD1.replace('dp.create_streaming_table("latest")', clustered),
        "history.sql": SQL_SCD2.replace(
            "STREAMING TABLE history;",
            "STREAMING TABLE history CLUSTER BY (id) TBLPROPERTIES ('autocdc.test.owner' = 'a');",
        ),
    }
    spec = write_project(tmp_path, database, files)
    drop(tmp_path, "1", A)
    order = run(spark, spec)
    assert order.index("changes") < order.index("latest") < order.index("live_keys")
    assert scd1_rows(spark, f"{database}.latest") == fold_scd1(A)
    names = ("latest", "history")  # DESCRIBE DETAIL takes `history` for a column
    details = {t: DeltaTable.forName(spark, f"{database}.{t}").detail().first() for t in names}
    assert [details[t].clusteringColumns for t in ("latest", "history")] == [["id"], ["id"]]
    assert details["history"].properties["autocdc.test.owner"] == "a"

    drop(tmp_path, "2", B)
    drop(tmp_path, "3", C)
    run(spark, spec)
    assert scd1_rows(spark, f"{database}.latest") == fold_scd1(A + B + C)
    assert scd2_rows(spark, f"{database}.history") == fold_scd2(A + B + C)
    assert spark.table(f"{database}.live_keys").first().n == len(fold_scd1(A + B + C))

    run(spark, spec)  # nothing new: nothing changes
    assert scd2_rows(spark, f"{database}.history") == fold_scd2(A + B + C)


TWO_PRODUCERS = """
from autocdc import pipelines as dp

@dp.temporary_view
def orders():
    return spark.readStream.schema("{feed}").json("{data}")

@dp.temporary_view
def backfill():  # another producer: its own columns for the sequence and the delete
    return spark.readStream.schema("id INT, a STRING, b INT, kind STRING, n BIGINT").json(
        "{data}2"
    )

for scd_type, target in ((1, "latest"), (2, "history")):
    dp.create_streaming_table(target)
    dp.create_auto_cdc_flow(
        target=target, source="orders", name=f"{{target}}_orders", keys=["id"],
        sequence_by="seq", apply_as_deletes="op = 'D'", except_column_list=["op", "seq"],
        stored_as_scd_type=scd_type,
    )
    dp.create_auto_cdc_flow(
        target=target, source="backfill", name=f"{{target}}_backfill", keys=["id"],
        sequence_by="n", apply_as_deletes="kind = 'D'", column_list=["id", "a", "b"],
        stored_as_scd_type=scd_type,
    )
"""


def test_two_flows_from_two_producers_into_one_target(spark, tmp_path, database):
    """Each flow with its own source, sequence column, delete condition and column
    selection, over three runs: each target is the fold of the union of both feeds."""
    spec = write_project(tmp_path, database, {"flows.py": TWO_PRODUCERS})
    drop(tmp_path, "1", A)
    drop(tmp_path, "1", B, folder="data2", op="kind", seq="n")
    run(spark, spec)
    assert scd1_rows(spark, f"{database}.latest") == fold_scd1(A + B)
    drop(tmp_path, "2", C)
    run(spark, spec)
    # A replay of the other producer's changes.
    drop(tmp_path, "2", A + C, folder="data2", op="kind", seq="n")
    run(spark, spec)
    assert scd1_rows(spark, f"{database}.latest") == fold_scd1(A + B + C)
    assert scd2_rows(spark, f"{database}.history") == fold_scd2(A + B + C)
    tables = {t.name for t in spark.catalog.listTables(database) if not t.isTemporary}
    assert "latest__autocdc_state" in tables  # one state per target, shared by its flows
    assert not [t for t in tables if "orders" in t or "backfill" in t]


AUTOCDC_CDF = """
from autocdc import pipelines as dp

@dp.temporary_view
def source_changes():
    return spark.readStream.option("readChangeFeed", "true").table("{db}.source")

dp.create_streaming_table("mirror")
dp.create_auto_cdc_flow(
    target="mirror", source="source_changes", keys=["id"], sequence_by="_commit_version",
    apply_as_deletes="_change_type = 'delete'",
    except_column_list=["_change_type", "_commit_version", "_commit_timestamp"],
    stored_as_scd_type=2, track_history_except_column_list=["b"],
)
"""


def test_change_data_feed_source_with_autocdc_dp(spark, tmp_path, database):
    """A Delta table's change data feed mirrored as SCD2 (autocdc's dp): pre-images are
    skipped, so the open versions equal the source table after every run."""
    source = f"{database}.source"
    spark.sql(f"CREATE DATABASE IF NOT EXISTS {database}")
    spark.sql(
        f"CREATE TABLE {source} (id INT, a STRING, b INT) USING delta "
        f"LOCATION '{tmp_path / 'source'}' TBLPROPERTIES (delta.enableChangeDataFeed = true)"
    )
    spark.sql(f"INSERT INTO {source} VALUES (1, 'x', 1), (2, 'y', 2), (3, 'z', 3)")
    spark.sql(f"UPDATE {source} SET a = 'x2' WHERE id = 1")
    spec = write_project(tmp_path / "project", database, {"mirror.py": AUTOCDC_CDF})

    def open_versions() -> set:
        rows = spark.table(f"{database}.mirror").where("__END_AT IS NULL").collect()
        return {(r.id, r.a, r.b) for r in rows}

    run(spark, spec)
    assert open_versions() == {tuple(r) for r in spark.table(source).collect()}
    spark.sql(f"DELETE FROM {source} WHERE id = 2")
    spark.sql(f"UPDATE {source} SET b = 30 WHERE id = 3")  # untracked: no new version
    spark.sql(f"INSERT INTO {source} VALUES (4, 'w', 4)")
    run(spark, spec)
    assert open_versions() == {tuple(r) for r in spark.table(source).collect()}
    versions = spark.table(f"{database}.mirror").where("id = 3").count()
    assert versions == 1


# A source whose reader fails in a Python worker with an autocdc error (as the PostgreSQL
# source's reader does when a table it loads was dropped).
FAILING_SOURCE = """
from pyspark import pipelines as dp
from pyspark.sql import functions as F
from autocdc.sources.errors import TableNotFoundError

@F.udf("int")
def lost(id):
    raise TableNotFoundError(table="public.gone_00000003")

@dp.temporary_view
def changes():
    return spark.readStream.schema("{feed}").json("{data}").withColumn("id", lost("id"))

dp.create_streaming_table("latest")
dp.create_auto_cdc_flow(
    target="latest", source="changes", keys=["id"], sequence_by="seq",
    apply_as_deletes="op = 'D'", except_column_list=["op", "seq"],
)
"""


def test_an_autocdc_error_raised_in_a_python_worker_reaches_the_caller(spark, tmp_path, database):
    """Not Spark's StreamingQueryException with a worker's traceback inside: the autocdc
    error itself, which the CLI prints in one line with exit status 2."""
    spec = write_project(tmp_path, database, {"feed.py": FAILING_SOURCE})
    drop(tmp_path, "1", A)
    with pytest.raises(TableNotFoundError) as raised:
        run(spark, spec)
    assert str(raised.value).startswith("[AUTOCDC_POSTGRES_TABLE_NOT_FOUND] ")
    assert "public.gone_00000003" in str(raised.value)
    assert "Traceback" not in str(raised.value)


def test_full_refresh_reprocesses_from_the_sources(spark, tmp_path, database):
    """A changed definition is refused until a full refresh of its target, which then
    reprocesses what the source holds now."""
    spec = write_project(tmp_path, database, {"feed.py": PYSPARK_SCD1})
    drop(tmp_path, "1", A + B)
    run(spark, spec)
    (tmp_path / "data" / "1.json").unlink()
    drop(tmp_path, "2", C)
    feed = tmp_path / "transformations" / "feed.py"
    scd2 = feed.read_text().replace("from pyspark import", "from autocdc import")
    feed.write_text(
        scd2.replace("except_column_list=", "stored_as_scd_type=2, except_column_list=")
    )
    with pytest.raises(DefinitionChangedError) as refused:
        run(spark, spec)
    assert refused.value.params["flow"] == "latest"  # where the pipeline declares it
    assert "transformations/feed.py:" in refused.value.params["where"]
    assert "`autocdc run --full-refresh latest`" in str(refused.value)
    assert "flow.full_refresh" not in str(refused.value)
    run(spark, spec, full_refresh={"latest"})
    assert scd2_rows(spark, f"{database}.latest") == fold_scd2(C)
    with pytest.raises(errors.UnknownDatasetError):
        run(spark, spec, refresh={"nope"})


BAD = {
    "cycle": (
        errors.CycleError,
        {
            "views.sql": "CREATE MATERIALIZED VIEW a AS SELECT * FROM b;\n"
            "CREATE MATERIALIZED VIEW b AS SELECT * FROM a;"
        },
    ),
    "undefined_target": (
        errors.UndefinedTargetError,
        {
            "flow.py": """
            from pyspark import pipelines as dp
            @dp.append_flow(target="nowhere")
            def f():
                return spark.readStream.schema("{feed}").json("{data}")
            """
        },
    ),
    "duplicate_dataset": (
        errors.DuplicateDatasetError,
        {
            "one.sql": "CREATE MATERIALIZED VIEW v AS SELECT 1 AS x;",
            "two.sql": "CREATE MATERIALIZED VIEW v AS SELECT 2 AS x;",
        },
    ),
    "cdc_into_a_view": (
        errors.NotAStreamingTableError,
        {
            "cdc.sql": "CREATE MATERIALIZED VIEW v AS SELECT 1 AS id, 1 AS seq;\n"
            "CREATE FLOW f AS AUTO CDC INTO v FROM v KEYS (id) SEQUENCE BY seq;"
        },
    ),
    "unknown_key": (
        UnknownColumnError,
        {
            "feed.py": PYSPARK_SCD1,
            "cdc.sql": "CREATE STREAMING TABLE t;\n"
            "CREATE FLOW f AS AUTO CDC INTO t FROM STREAM(changes) KEYS (idd) SEQUENCE BY seq;",
        },
    ),
    "flows_disagree": (
        errors.FlowsDisagreeError,
        {
            "feed.py": PYSPARK_SCD1,
            "more.sql": "CREATE FLOW backfill AS AUTO CDC INTO latest FROM STREAM(changes) "
            "KEYS (id, a) SEQUENCE BY seq COLUMNS * EXCEPT (op, seq);",
        },
    ),
    "sql_option_the_engine_refuses": (
        TrackHistoryWithScd1Error,
        {
            "feed.py": PYSPARK_SCD1,
            "cdc.sql": "CREATE STREAMING TABLE t;\n"
            "CREATE FLOW f AS AUTO CDC INTO t FROM STREAM(changes) KEYS (id) SEQUENCE BY seq\n"
            "TRACK HISTORY ON (a);",
        },
    ),
    "debezium_unknown_connector": (
        UnknownConnectorError,
        {
            "cdc.sql": "CREATE DEBEZIUM SOURCE s FROM KAFKA 'k:1' TOPICS ('t') CONNECTOR oracle "
            "SCHEMA (id INT);"
        },
    ),
    "scd2_of_pyspark_dp": (
        errors.PipelineDefinitionError,
        {
            "cdc.py": """
            from pyspark import pipelines as dp
            dp.create_streaming_table("t")
            dp.create_auto_cdc_flow(target="t", source="s", keys=["id"], sequence_by="seq",
                                    stored_as_scd_type=2)
            """
        },
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_definitions_are_refused_before_anything_runs(spark, tmp_path, database, case):
    error_class, files = BAD[case]
    drop(tmp_path, "1", A)
    spec = write_project(tmp_path, database, files)
    with pytest.raises(error_class) as raised:
        run(spark, spec)
    if case == "unknown_key":  # the engine's error, where the flow is declared
        assert raised.value.params["where"].endswith("cdc.sql:2")
        assert raised.value.params["flow"] == "f"
    if case == "flows_disagree":
        assert raised.value.params["field"] == "keys"
        assert (raised.value.params["flow"], raised.value.params["other"]) == ("backfill", "latest")
    if case == "sql_option_the_engine_refuses":  # the engine's error, at its line
        assert raised.value.params["where"].endswith("cdc.sql:2")
        assert raised.value.params["flow"] == "f"
    if case == "scd2_of_pyspark_dp":
        assert raised.value.params["where"].endswith("cdc.py:4")
    assert [t.name for t in spark.catalog.listTables(database) if not t.isTemporary] == []
    assert not (tmp_path / "storage").exists()


@pytest.mark.parametrize("case", ["cycle", "bad_glob", "sql_syntax"])
def test_cli_exits_2_and_writes_nothing(spark, tmp_path, database, monkeypatch, case):
    monkeypatch.chdir(tmp_path)
    files = {"sql_syntax": {"t.sql": "CREATE STREAMING TABEL t;"}}.get(case, BAD["cycle"][1])
    spec = write_project(tmp_path, database, files)
    if case == "bad_glob":
        spec.write_text(spec.read_text().replace("transformations/**", "transformations/*.py"))
    try:
        assert cli.main(["run", "--spec", str(spec)]) == 2
    finally:
        spark.catalog.setCurrentDatabase("default")
    assert not (tmp_path / "storage").exists()


def test_cli_exits_2_on_a_bad_spec_without_starting_spark(tmp_path):
    (tmp_path / "spark-pipeline.yml").write_text("name: x\nstorage: s\nlibraris: []\n")
    done = subprocess.run(
        [sys.executable, "-m", "autocdc", "run", "--spec", str(tmp_path / "spark-pipeline.yml")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert done.returncode == 2
    assert "AUTOCDC_PIPELINE_SPEC_INVALID" in done.stderr and "libraris" in done.stderr


def test_init_sample_runs_at_once_and_a_moved_copy_goes_on_where_it_was(
    spark, tmp_path, monkeypatch
):
    """The sample runs as created. A copy of the whole project (its checkpoints name the
    files they read by absolute path) goes on where the original stood: its checkpoints
    are translated, the event log says so, no file is read again and a new one is; before
    that, its status counts the files waiting in the copy, not in the original. A source
    moved on its own is refused with the fix, before its flows start."""
    root = scaffold.create(tmp_path / "sample")
    monkeypatch.chdir(root)
    assert run(spark, root / "spark-pipeline.yml")[0] == "customer_changes"
    expected = {(1, "Alice", "Lyon"), (3, "Carol", "Rome")}
    assert {(r.id, r.name, r.city) for r in spark.table("customers").collect()} == expected
    assert spark.table("customers_history").count() == 4

    copy = Path(shutil.copytree(root, tmp_path / "copy", symlinks=True))
    monkeypatch.chdir(copy)
    changes = copy / "data" / "changes"
    (changes / "0002.json").write_text(
        '{"id": 3, "name": "Carol", "city": "Milan", "op": "U", "seq": 7}\n'
    )
    for name in ("0003.json", "0004.json"):  # the original's only
        (root / "data" / "changes" / name).write_text("{}\n")
    # Before the copy's first run its status reads the copy: one new file, not the original's.
    waiting = overview.status(project.load(copy / "spark-pipeline.yml"))["flows"]
    assert {f["flow"]: f["lag"]["files"] for f in waiting} == {
        "customers": 1,
        "customers_history_cdc": 1,
    }
    run(spark, copy / "spark-pipeline.yml")
    expected = {(1, "Alice", "Lyon"), (3, "Carol", "Milan")}
    assert {(r.id, r.name, r.city) for r in spark.table("customers").collect()} == expected
    assert spark.table("customers_history").count() == 5
    events = spark.read.format("delta").load(str(copy / "storage" / "event_log"))
    batches = events.where("event_type = 'batch' AND flow = 'customers'").orderBy("event_time")
    batches = batches.collect()
    assert [b.rows_in for b in batches] == [5, 1]  # the copy read only the new file
    moved = events.where("event_type = 'checkpoint_moved'").collect()
    assert len(moved) == 2 and "customers" in {m.flow for m in moved}  # both flows read files
    assert str(root) in moved[0].message and str(copy) in moved[0].message

    changes.rename(copy / "data" / "elsewhere")  # the source alone moves
    library = copy / "transformations" / "customers.py"
    library.write_text(library.read_text().replace("data/changes", "data/elsewhere"))
    with pytest.raises(errors.CheckpointElsewhereError) as refused:
        run(spark, copy / "spark-pipeline.yml")
    assert refused.value.params["flow"] == "customers"
    assert refused.value.params["recorded"] == changes
    assert refused.value.params["location"] == copy / "data" / "elsewhere"
    assert "`autocdc run --full-refresh customers`" in str(refused.value)


def test_kafka_offsets_a_new_broker_lacks_say_to_refresh():
    """Spark's Kafka data-loss failure (the checkpoint is an earlier broker's: the example's
    servers started again) becomes one error naming the full refresh, where Spark's own
    advises failOnDataLoss, which would skip the gap silently."""
    spark_said = RuntimeError(
        "[STREAM_FAILED] Query [id = 1] terminated with exception: [KAFKA_DATA_LOSS] Some "
        "data may have been lost because they are not available in Kafka any more; ..."
    )
    lost = runner.data_lost(spark_said, "customers_cdc", "customers")
    assert isinstance(lost, errors.SourceDataLostError)
    assert lost.params == {"flow": "customers_cdc", "dataset": "customers"}
    assert "`autocdc run --full-refresh customers`" in str(lost)
    assert runner.data_lost(RuntimeError("[STREAM_FAILED] other"), "f", "d") is None


def test_dry_run_resolves_and_writes_nothing(spark, tmp_path, database, monkeypatch, capsys):
    """A dry run writes nothing; it logs in the project folder, whose warehouse is outside
    it (as the demo's is)."""
    monkeypatch.chdir(tmp_path)  # the CLI moves into the project folder
    config = {"spark.sql.warehouse.dir": "../warehouse"}
    project_root = tmp_path / "project"
    spec = write_project(
        project_root, database, {"feed.py": PYSPARK_SCD1, "history.sql": SQL_SCD2}, config
    )
    drop(project_root, "1", A)
    try:
        assert cli.main(["dry-run", "--spec", str(spec)]) == 0
    finally:
        spark.catalog.setCurrentDatabase("default")
    assert log_file() == project_root / "autocdc-logs" / "autocdc.log"
    out = capsys.readouterr().out
    assert "4 datasets (changes, " in out and "nothing written" in out
    assert [t.name for t in spark.catalog.listTables(database) if not t.isTemporary] == []
    assert not (project_root / "storage").exists()


ORDERS_EXAMPLE = ROOT / "pipelines" / "orders"
# The columns of `orders` after its key, as the reference's values; which a producer sets.
ORDER_COLUMNS = ["customer", "status", "amount", "shipped_at", "carrier"]
SHOP_SETS = frozenset({0, 1, 2})


def order_changes(folder: Path) -> list[Change]:
    """The example's change files as the reference sees them: shop and backfill rows set
    the order's columns, a scan those its `updated_fields` lists (NULL: both of its)."""
    changes = []
    for path in sorted(folder.glob("*/*.json")):
        for line in path.read_text().splitlines():
            row = json.loads(line)
            values = tuple(row.get(c) for c in ORDER_COLUMNS)
            if path.parent.name == "shipping":
                listed = row["updated_fields"] or ORDER_COLUMNS[3:]
                sets = frozenset(ORDER_COLUMNS.index(c) for c in listed)
                changes.append(Change(row["order_id"], row["scanned_at"], UPSERT, values, sets))
            else:
                op = DELETE if row["op"] == "D" else UPSERT
                changes.append(Change(row["order_id"], row["updated_at"], op, values, SHOP_SETS))
    return changes


def order_rows(spark, table: str) -> dict:
    """Key -> values as the change files write them (times formatted in the session's
    time zone, UTC, as they were read)."""
    shipped = F.date_format("shipped_at", "yyyy-MM-dd'T'HH:mm:ss").alias("shipped_at")
    amount = F.col("amount").cast("double").alias("amount")
    rows = spark.table(table).select("order_id", "customer", "status", amount, shipped, "carrier")
    return {r.order_id: tuple(r[c] for c in ORDER_COLUMNS) for r in rows.collect()}


def test_orders_example_once_flow_over_two_runs_and_a_full_refresh(spark, tmp_path, database):
    """pipelines/orders on a copy: the shop's full rows, the warehouse's partial scans
    and a once backfill into one table. Run 1 applies all three (the second change files
    held back); run 2 the new change files, not a backfill file added meanwhile (the once
    flow ran); a full refresh runs the backfill again, with that file. Each time the
    table is the reference fold of what was applied."""
    root = tmp_path / "orders"
    shutil.copytree(ORDERS_EXAMPLE, root, ignore=shutil.ignore_patterns("storage", "warehouse"))
    spec = root / "spark-pipeline.yml"
    spec.write_text(spec.read_text().replace("database: orders_demo", f"database: {database}"))
    held = tmp_path / "held"
    for producer in ("shop", "shipping"):
        (held / producer).mkdir(parents=True)
        (root / "data" / producer / "batch-2.json").rename(held / producer / "batch-2.json")
    table = f"{database}.orders"

    run(spark, spec)
    assert order_rows(spark, table) == fold_scd1(order_changes(root / "data"), partial=True)

    for producer in ("shop", "shipping"):
        (held / producer / "batch-2.json").rename(root / "data" / producer / "batch-2.json")
    late = '{"order_id": 5, "customer": "eve", "status": "placed", "amount": 9.5, "op": "U", '
    (root / "data" / "backfill" / "late.json").write_text(
        late + '"updated_at": "2026-03-01T08:00:00"}\n'
    )
    run(spark, spec)
    applied = [c for c in order_changes(root / "data") if c.key != 5]
    assert order_rows(spark, table) == fold_scd1(applied, partial=True)
    assert 5 not in order_rows(spark, table)

    run(spark, spec, full_refresh={"orders"})
    assert order_rows(spark, table) == fold_scd1(order_changes(root / "data"), partial=True)
    assert order_rows(spark, table)[1] == ("ada", "shipped", 30.0, "2026-03-01T12:00:00", "FedEx")


def test_flows_into_one_target_share_whether_it_is_partial_and_what_it_tracks(spark):
    """One partial flow makes every flow into its target declare the target partial (the
    state they share is created by whichever runs first); SCD2 flows must track the same
    columns (whichever runs recomputes the history)."""
    flows = registry.Registry(spark)
    flows.add_dataset(registry.Dataset("t", "streaming_table", "t.py:1"))
    common = {"keys": ["id"], "sequence_by": "seq", "stored_as_scd_type": 2}
    for name, extra in (("full", {}), ("partial", {"columns_to_update": ["a"]})):
        flows.add_flow(_cdc_flow(name, {**common, **extra}))
    placed = kinds.place(flows, graph.check_targets(flows), lambda name: f"db.{name}")
    assert [placed[f].engine.partial_target for f in ("full", "partial")] == [True, True]
    assert not flows.flows["full"].definition.partial_target  # the declaration stays as it was
    assert placed["full"].engine.partial
    assert placed["full"].engine.target == "db.t"

    flows.add_flow(_cdc_flow("other", {**common, "track_history_column_list": ["a"]}))
    with pytest.raises(errors.FlowsDisagreeError) as raised:
        graph.check_targets(flows)
    assert raised.value.params["field"] == "track_history_column_list"


def test_a_flow_is_built_and_checked_once_where_it_is_declared(spark):
    """The engine's flow is built when its declaration is read (a bad option fails there
    with the engine's error, naming the line) and handed on as it is."""
    flows = registry.Registry(spark)
    cdc = "CREATE FLOW f AS AUTO CDC INTO t FROM STREAM(s) KEYS (id) SEQUENCE BY seq"
    with pytest.raises(TrackHistoryWithScd1Error) as raised:
        flows.register_sql(f"{cdc}\nTRACK HISTORY ON (a);", Path("cdc.sql"))
    assert raised.value.params["where"] == "cdc.sql:1"
    assert raised.value.params["flow"] == "f"
    assert str(raised.value).startswith("[AUTOCDC_TRACK_HISTORY_WITH_SCD1] cdc.sql:1: flow `f`: ")
    flows.register_sql(f"{cdc};", Path("cdc.sql"))
    spec = flows.flows["f"].definition
    assert (spec.target, spec.name, spec.keys, spec.sequence_by) == ("t", "f", ["id"], "seq")
    flows.add_dataset(registry.Dataset("t", "streaming_table", "t.py:1"))
    placed = kinds.place(flows, graph.check_targets(flows), lambda name: f"db.{name}")
    run = placed["f"].engine  # the flow a run applies: its name kept
    assert (run.target, run.flow_name, run.keys) == ("db.t", "f", ["id"])


def _cdc_flow(name: str, options: dict) -> registry.CdcFlow:
    """A flow into ``t`` declared at ``t.py:<name>`` with ``options``."""
    at = f"t.py:{name}"
    spec = registry.declared(registry.FlowDefinition, at, target="t", name=name, **options)
    return registry.CdcFlow(name, "t", "s", at, spec)


GROUPED = """
from autocdc import pipelines as dp

GROUPS = {{"shop": ["a"], "warehouse": ["b"]}}

@dp.temporary_view
def shop():
    return spark.readStream.schema("id INT, a STRING, op STRING, seq BIGINT").json("{data}")

@dp.temporary_view
def warehouse():  # its own clock, of another type
    return spark.readStream.schema("id INT, b INT, kind STRING, ts TIMESTAMP").json("{data}2")

dp.create_streaming_table("orders")
dp.create_auto_cdc_flow(
    target="orders", source="shop", name="orders_shop", keys=["id"], sequence_by="seq",
    apply_as_deletes="op = 'D'", except_column_list=["op", "seq"],
    sequence_groups=GROUPS, sequence_group="shop",
)
"""
GROUPED_SQL = """
CREATE FLOW orders_warehouse AS AUTO CDC INTO orders
FROM STREAM(warehouse)
KEYS (id)
APPLY AS DELETE WHEN kind = 'D'
SEQUENCE BY ts
SEQUENCE GROUP warehouse IN (shop (a), warehouse (b))
COLUMNS * EXCEPT (kind, ts);
"""


def test_sequence_groups_in_a_pipeline(spark, tmp_path, database):
    """Two producers on their own clocks (a bigint, a timestamp) feed one streaming
    table, each its own sequence group (the shop's flow in Python, the warehouse's in
    SQL); a delete from the shop leaves the warehouse's column (docs/semantics.md,
    sequence groups); a flow declaring other groups is refused before anything runs."""
    spec = write_project(tmp_path, database, {"flows.py": GROUPED, "warehouse.sql": GROUPED_SQL})
    shop = [
        {"id": 1, "a": "paid", "op": "U", "seq": 10},
        {"id": 1, "op": "D", "seq": 11},
        {"id": 2, "a": "placed", "op": "U", "seq": 5},
    ]
    warehouse = [
        {"id": 1, "b": 7, "kind": "U", "ts": "2026-01-01T09:00:00"},
        {"id": 2, "b": 8, "kind": "U", "ts": "2026-01-01T09:00:00"},
        {"id": 2, "kind": "D", "ts": "2026-01-01T10:00:00"},
    ]
    for folder, changes in (("data", shop), ("data2", warehouse)):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "1.json").write_text("\n".join(map(json.dumps, changes)) + "\n")
    run(spark, spec)
    got = {r.id: (r.a, r.b) for r in spark.table(f"{database}.orders").collect()}
    assert got == {1: (None, 7), 2: ("placed", None)}

    flows = registry.Registry(spark)
    flows.add_dataset(registry.Dataset("t", "streaming_table", "t.py:1"))
    common = {"keys": ["id"], "sequence_by": "seq", "sequence_group": "x"}
    for name, groups in (("one", {"x": ["a"], "y": ["b"]}), ("two", {"x": ["a", "b"]})):
        flows.add_flow(_cdc_flow(name, {**common, "sequence_groups": groups}))
    with pytest.raises(errors.FlowsDisagreeError) as raised:
        graph.check_targets(flows)
    assert raised.value.params["field"] == "sequence_groups"


# Delta's note of the last commit this session made: set by every write, anyone's.
DELTA_LAST_COMMIT = "spark.databricks.delta.lastCommitVersionInSession"


def _session(spark) -> tuple:
    """What a run must give back: the session's conf, current database, the JVM's and
    Python's working folders."""
    conf = {r.key: r.value for r in spark.sql("SET").collect() if r.key != DELTA_LAST_COMMIT}
    return conf, spark.catalog.currentDatabase(), pipeline.working_folder(spark), Path.cwd()


def _same_session(spark, before: tuple) -> None:
    conf, *rest = _session(spark)
    changed = {k for k in conf.keys() | before[0].keys() if conf.get(k) != before[0].get(k)}
    assert (changed, rest) == (set(), list(before[1:]))


def test_declaring_and_running_leave_the_session_as_they_found_it(
    spark, tmp_path, database, monkeypatch
):
    """dp.run and each command of the CLI run in-process (on this session, as the CLI
    would on its own) give the session back: a SQL file's SET holds for the run only, the
    spec's database and the project's folder are the run's, not the session's after."""
    setting = "SET spark.sql.shuffle.partitions = 3;\n"
    spec = write_project(tmp_path, database, {"feed.py": PYSPARK_SCD1, "h.sql": setting + SQL_SCD2})
    drop(tmp_path, "1", A)
    monkeypatch.setattr(cli, "spark_session", lambda *args, **kwargs: spark)
    before = _session(spark)
    assert set(dp.run(spec, spark)) == {"changes", "latest", "history", "live_keys"}
    _same_session(spark, before)
    for command in (["run"], ["dry-run"], ["apply"], ["status"], ["history", "latest"]):
        assert cli.main([*command, "--spec", str(spec)]) == 0, command
        _same_session(spark, before)
    assert scd1_rows(spark, f"{database}.latest") == fold_scd1(A)


def test_the_run_outline_owns_ctrl_c_and_gives_the_handler_back(spark, tmp_path, database):
    """Inside the outline Ctrl-C is noted (its work stopped, the run ended at a safe point),
    not pyspark's handler's (which cancels jobs from inside whatever py4j call the main
    thread is in); the handler from before is back after, in a notebook's dp.run too."""
    spec = write_project(tmp_path, database, {"feed.py": PYSPARK_SCD1})
    drop(tmp_path, "1", A)
    before = signal.getsignal(signal.SIGINT)
    seen = []
    pipeline.execute(
        spark,
        project.load(spec),
        runner.Options(),
        "dry-run",
        on_resolved=lambda _: seen.append(signal.getsignal(signal.SIGINT)),
    )
    assert seen == [interrupt._noted]
    assert signal.getsignal(signal.SIGINT) is before


def test_dp_run_holds_the_run_lock_and_gives_the_session_back(spark, tmp_path, new_table):
    """``dp.run`` in a notebook: refused while another run holds the project; after it the
    session's current database and working folder are what they were."""
    root = scaffold.create(tmp_path / "notebook")
    spec = root / "spark-pipeline.yml"
    database = new_table("nb")
    spec.write_text(spec.read_text() + f"database: {database}\n")
    loaded = project.load(spec)
    folder = pipeline.working_folder(spark)
    with lock.hold(loaded.storage_path, loaded.name), pytest.raises(errors.PipelineLockedError):
        dp.run(spec, spark)
    assert dp.run(spec, spark)[0] == "customer_changes"
    assert spark.catalog.currentDatabase() == "default"
    assert pipeline.working_folder(spark) == folder
    rows = spark.table(f"{database}.customers").collect()
    assert {(r.id, r.city) for r in rows} == {(1, "Lyon"), (3, "Rome")}


def test_a_view_over_a_target_with_no_rows_yet_waits_for_them(spark, tmp_path, database, capsys):
    """A materialized view over an AUTO CDC target whose source holds nothing yet (so no
    micro-batch has created the target; likewise a continuous run's first pass): the run
    says the view waits and succeeds; the next run with rows computes it."""
    view = "CREATE MATERIALIZED VIEW live_keys AS SELECT count(*) AS n FROM latest;"
    spec = write_project(tmp_path, database, {"feed.py": PYSPARK_SCD1, "view.sql": view})
    (tmp_path / "data").mkdir()
    run(spark, spec)
    said = capsys.readouterr().out
    assert f"materialized view {database}.live_keys: waiting for {database}.latest" in said
    assert not spark.catalog.tableExists(f"{database}.live_keys")

    drop(tmp_path, "1", A)
    run(spark, spec)
    assert spark.table(f"{database}.live_keys").first().n == len(fold_scd1(A))
