"""The scenario both Debezium connector tests run (PostgreSQL's connector, MariaDB's): a
pipeline with an SCD type 1 and an SCD type 2 target over the connector's topic, the
writes made to the table, the versions they leave, and the runs until the targets mirror
the table."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

from projects import run, write_spec
from reference import UPSERT, Change

from autocdc.sources import kafkabroker

PIPELINE = """
from autocdc import pipelines as dp

dp.create_debezium_source(
    name="changes",
    bootstrap_servers="{servers}",
    {source}
    transaction_id="txid",
)
dp.create_streaming_table("customers")
dp.create_auto_cdc_flow(target="customers", source="changes", keys=["id"])
dp.create_streaming_table("customers_history")
dp.create_auto_cdc_flow(
    target="customers_history", source="changes", keys=["id"], stored_as_scd_type=2
)
"""
# Committed changes, one transaction a line, after the snapshot of ids 1-3.
WRITES = [
    "UPDATE customers SET name = NULL WHERE id = 1",
    "DELETE FROM customers WHERE id = 2",
    "BEGIN; INSERT INTO customers VALUES (4, 'Dan', 'Oslo'), (5, 'Eve', 'Rome'); COMMIT",
    "BEGIN; DELETE FROM customers WHERE id = 3; INSERT INTO customers VALUES (3, 'Cid', 'Lima');"
    " COMMIT",
    "UPDATE customers SET city = 'Bergen' WHERE id = 4",
]
# Each key's versions in commit order after WRITES, then (Connect down) an update of 5's
# city and a change of 4's key to 6.
VERSIONS = {
    1: [("Ann", "Oslo"), (None, "Oslo")],
    2: [("Bob", "Rome")],
    3: [("Cid", "Kyiv"), ("Cid", "Lima")],
    4: [("Dan", "Oslo"), ("Dan", "Bergen")],
    5: [("Eve", "Rome"), ("Eve", "Turin")],
    6: [("Dan", "Bergen")],
}


def project(root: Path, servers: str, source: str, database: str) -> Path:
    """The pipeline at ``root`` (``source``: the Debezium source's other arguments, as
    Python text); returns its spec."""
    (root / "transformations").mkdir(parents=True)
    (root / "transformations" / "customers.py").write_text(
        PIPELINE.format(servers=servers, source=source)
    )
    return write_spec(root, root.name, database, {"spark.sql.warehouse.dir": "warehouse"})


def versions(spark, database: str) -> dict[int, list[tuple]]:
    """Each key's (name, city) versions in the SCD2 target, in commit order."""
    history = spark.table(f"{database}.customers_history")
    return {
        k: [tuple(r)[1:3] for r in history.where(f"id = {k}").orderBy("__START_AT").collect()]
        for k in range(1, 7)
    }


def mirror(
    spark, spec: Path, table: Callable[[], list[tuple]], database: str, rounds: int = 8
) -> None:
    """Run the pipeline until the targets mirror ``table()``'s (id, name, city) rows
    (Connect delivers within seconds, not at once); fail with the difference after
    ``rounds`` runs."""
    expected = sorted(table())
    for _ in range(rounds):
        run(spark, spec)
        scd1 = sorted(tuple(r)[:3] for r in spark.table(f"{database}.customers").collect())
        open_rows = spark.table(f"{database}.customers_history").where("__END_AT IS NULL")
        scd2 = sorted(tuple(r)[:3] for r in open_rows.collect())
        if scd1 == expected and scd2 == expected:
            return
        time.sleep(2)
    assert (scd1, scd2) == (expected, expected), f"SCD1 {scd1}, SCD2 {scd2}, table {expected}"


def written(servers: str, topic: str, records: int) -> None:
    """Wait until ``topic`` holds at least ``records`` records: the connector's snapshot
    before the source takes its row schema from the events (before them it says so and
    the run fails), the changes before a run, so that it need not wait for a second."""
    deadline = time.monotonic() + 60
    found = None
    while time.monotonic() < deadline:
        found = kafkabroker.behind(servers, None, [topic], None)
        if found is not None and found.records >= records:
            return
        time.sleep(0.5)
    raise AssertionError(f"Debezium wrote not {records} records within 60 s: {found}")


def debezium_event(change: Change, extra: dict | None = None) -> str:
    """``change`` as Debezium's PostgreSQL connector writes it with the JSON converter
    (with schemas): its sequence is the event's LSN, a delete's ``before`` has the key."""
    row = {"id": change.key, "a": None, "b": None, **(extra or {})}
    if change.op == UPSERT:
        row["a"], row["b"] = change.values
    types = {"id": "int32", "a": "string", "b": "int32", "c": "int32"}
    fields = [{"type": types[k], "optional": k != "id", "field": k} for k in row]
    image = {"type": "struct", "fields": fields, "optional": True}
    schema = {
        "type": "struct",
        "fields": [{**image, "field": "before"}, {**image, "field": "after"}],
    }
    lsn = change.seq * 16
    source = {"schema": "public", "table": "t", "sequence": f'[null, "{lsn}"]', "lsn": lsn}
    upsert = change.op == UPSERT
    payload = {
        "op": "c" if upsert else "d",
        "before": None if upsert else {**row, "a": None, "b": None},
        "after": row if upsert else None,
        "source": source,
    }
    return json.dumps({"schema": schema, "payload": payload})
