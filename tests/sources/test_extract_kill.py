"""The extraction example (pipelines/extract) against a real server, end to end.

`autocdc run` is killed with SIGKILL mid-read (a batch's first page staged), then again
mid-apply (the first flow done, the second flow's target committed but not its
checkpoint), with inserts, updates, soft deletes and a row tied at the watermark written
between runs; then it runs in this process. After each successful run the SCD type 1
target equals the table's live rows, and the SCD type 2 target is the fold of every state
its runs read (so its open versions are the live rows): what the killed run committed,
read again, and the ties at the checkpoint, read again, are absorbed.
"""

from __future__ import annotations

import shutil
import signal
from pathlib import Path

import pytest
import yaml
from pgserver import Server
from processes import ROOT, finish, start
from projects import run
from pyspark.sql import functions as F
from reference import DELETE, UPSERT, Change, fold_scd2
from sparkconf import SUBPROCESS_CONF

from autocdc.pipelines.declare import project
from autocdc.pipelines.execute.checkpoint import FILE
from autocdc.pipelines.execute.extraction import LEASES, STAGING
from autocdc.pipelines.operations import overview
from autocdc.sources import extract

EXAMPLE = ROOT / "pipelines" / "extract"
# The killed runs read two rows per page, two batches at once, staged in files.
RUN_OPTIONS = ("--extract-options", "page_rows=2,max_concurrency=2,staging=true")
MICROS = "yyyy-MM-dd HH:mm:ss.SSSSSS"
ROWS = (
    "SELECT id, region, status, amount, "
    "to_char(updated_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US'), deleted FROM orders"
)


def _project(tmp_path: Path, warehouse: Path, database: str) -> Path:
    """A copy of the example writing into this session's warehouse (a database of its own),
    so its subprocess runs and this process's share the tables."""
    project = Path(shutil.copytree(EXAMPLE, tmp_path / "extract"))
    spec = project / "spark-pipeline.yml"
    settings = yaml.safe_load(spec.read_text())
    settings["database"] = database
    settings["configuration"] = {**SUBPROCESS_CONF, "spark.sql.warehouse.dir": str(warehouse)}
    spec.write_text(yaml.safe_dump(settings))
    return spec


def _state(server: Server) -> list[Change]:
    """The table now, as changes: each row an upsert at its updated_at, or a delete."""
    return [
        Change(key, at, DELETE if deleted else UPSERT, (region, status, amount, at))
        for key, region, status, amount, at, deleted in server.query(ROWS)
    ]


def _live(now: list[Change]) -> dict:
    return {c.key: c.values for c in now if c.op == UPSERT}


def _check(spark, database: str, now: list[Change], seen: list[Change]) -> None:
    """SCD1: the live rows ``now``; SCD2: the fold of every state ``seen``."""
    at = F.date_format("updated_at", MICROS)
    latest = spark.table(f"{database}.orders").select("id", "region", "status", "amount", at)
    assert {r[0]: tuple(r[1:]) for r in latest.collect()} == _live(now)
    history = spark.table(f"{database}.orders_history").select(
        "id",
        "region",
        "status",
        "amount",
        at,
        # Sequenced by updated_at, then by the read (docs/sources.md): the versions are
        # the fold's by updated_at.
        F.date_format("__START_AT.updated_at", MICROS),
        F.date_format("__END_AT.updated_at", MICROS),
    )
    got = {(r[0], tuple(r[1:5]), r[5], r[6]) for r in history.collect()}
    assert got == fold_scd2(seen)


def _jdbc_url(dsn: str) -> str:
    """The libpq string's server as a JDBC URL (the same database, read by Spark)."""
    given = dict(part.split("=", 1) for part in dsn.split())
    return (
        f"jdbc:postgresql://{given['host']}:{given['port']}/{given['dbname']}?user={given['user']}"
    )


@pytest.mark.e2e
@pytest.mark.parametrize("connection", ["dsn", "url"])
def test_extraction_killed_mid_read_and_mid_apply_mirrors_the_table(
    spark, tmp_path, warehouse, new_table, monkeypatch, connection
):
    """``dsn``: the libpq string, read in the driver; ``url``: the same server as a JDBC
    URL in the same variable (CONNECTION ENV), read by Spark's executors."""
    server = Server().start()
    try:
        server.execute((EXAMPLE / "shop.sql").read_text())
        given = server.dsn if connection == "dsn" else _jdbc_url(server.dsn)
        monkeypatch.setenv("AUTOCDC_POSTGRES_DSN", given)
        database = new_table("extract")
        spec = _project(tmp_path, warehouse, database)
        storage = spec.parent / "storage"
        orders, history = (storage / "checkpoints" / f for f in ("orders", "orders_history"))

        assert finish(start(spec, "extract_mid_read", *RUN_OPTIONS)) == -signal.SIGKILL
        assert not (orders / FILE).exists()
        assert list((orders / STAGING).rglob("*.parquet"))  # dsn: a batch's first page
        assert (storage / LEASES / "orders_src.lock").exists()  # a dead run's
        server.execute(
            "UPDATE orders SET status = 'paid', updated_at = now() WHERE id = 1;"
            "UPDATE orders SET deleted = true, updated_at = now() WHERE id = 3;"
            "INSERT INTO orders (id, region, status, amount) VALUES (6, 'latam', 'new', 6)"
        )

        # `orders` runs whole; `orders_history` is killed once its target committed.
        seen = now = _state(server)
        assert finish(start(spec, "after_target_commit@2", *RUN_OPTIONS)) == -signal.SIGKILL
        latest = spark.read.format("delta").load(str(warehouse / f"{database}.db" / "orders"))
        at = F.date_format("updated_at", MICROS)
        rows = latest.select("id", "region", "status", "amount", at).collect()
        assert {r[0]: tuple(r[1:]) for r in rows} == _live(now)
        assert not (orders / STAGING).exists()
        assert not (history / FILE).exists()  # its target committed, its checkpoint did not
        checkpoint = extract.loads((orders / FILE).read_text())["checkpoint"]["updated_at"]

        # A row tied at `orders`' checkpoint (written after the run, at the same time),
        # and later changes: every row at or after the checkpoint is read again.
        server.execute(
            "INSERT INTO orders (id, region, status, amount, updated_at) "
            "SELECT 7, 'eu', 'new', 7, max(updated_at) FROM orders;"
            "UPDATE orders SET status = 'shipped', updated_at = now() WHERE id = 4;"
            "UPDATE orders SET deleted = true, updated_at = now() WHERE id = 5;"
            "UPDATE orders SET amount = 30, updated_at = now() WHERE id = 2"
        )
        ((expected,),) = server.query(
            "SELECT count(*) FROM orders WHERE updated_at >= %s", (checkpoint,)
        )
        now = _state(server)
        run(spark, spec)
        _check(spark, database, now, seen + now)
        events = spark.read.format("delta").load(str(storage / "event_log"))
        batches = events.where("flow = 'orders' AND event_type = 'batch'").orderBy("event_time")
        # 1, 3 and 6 at the checkpoint again, 7 tied with them, then 4, 5 and 2
        assert batches.collect()[-1].rows_in == expected == 7
        assert not (storage / LEASES / "orders_src.lock").exists()
        assert (history / FILE).exists()
        flows = {f["flow"]: f for f in overview.status(project.load(spec))["flows"]}
        assert flows["orders"]["live_rows"] == len(_live(now))
        assert flows["orders_history"]["last_batch"]["rows_applied"] > 0
    finally:
        server.stop()
