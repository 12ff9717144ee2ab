"""Debezium's events through a real Kafka broker (KRaft, started here from Maven's jars):
the Debezium example's PostgreSQL flow reading the topic with ``autocdc.debezium_kafka``
instead of files, run three times as the events arrive."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest
from kafkaserver import Broker
from test_pipelines import run

pytestmark = pytest.mark.e2e

EXAMPLE = Path(__file__).parent.parent / "pipelines" / "debezium"
TOPIC = "shop.public.customers"
# The PostgreSQL flow of the example, reading Kafka: no glue but the source's declaration.
CUSTOMERS = """
import autocdc
from autocdc import pipelines as dp


@dp.temporary_view
def customer_changes():
    return autocdc.debezium_kafka(
        spark,  # noqa: F821
        bootstrap_servers="{servers}",
        topics=["{topic}"],
        row_schema="id INT, name STRING, city STRING",
        connector="postgresql",
        table="public.customers",
    )


dp.create_streaming_table("customers")
dp.create_auto_cdc_flow(target="customers", source="customer_changes", keys=["id"])
"""


@pytest.fixture(scope="module")
def broker():
    started = Broker().start()
    yield started
    started.stop()


def produce(spark, servers: str, values: list[str | None]) -> None:
    """Values as Debezium's JSON converter writes them; None is a Kafka tombstone."""
    rows = spark.createDataFrame([(v,) for v in values], "value string").coalesce(1)
    rows.write.format("kafka").option("kafka.bootstrap.servers", servers).option(
        "topic", TOPIC
    ).save()


def test_debezium_topic_to_delta_across_runs(spark, broker, tmp_path, new_table, monkeypatch):
    """Each run applies only what arrived since the last (the query's checkpoint keeps the
    offsets: the one malformed event is quarantined once), Kafka and old-style tombstones
    are skipped, another table's events in the topic are left out, and the tables end as
    the example's hand-worked answer says."""
    root = tmp_path / "debezium"
    shutil.copytree(
        EXAMPLE, root, ignore=shutil.ignore_patterns("storage", "warehouse", "autocdc-*")
    )
    (root / "data" / "postgres").rename(tmp_path / "events")
    (root / "transformations" / "customers.py").write_text(
        CUSTOMERS.format(servers=broker.servers, topic=TOPIC)
    )
    (root / "transformations" / "products.py").unlink()  # the MySQL flow reads files
    database = new_table("dbz_kafka")
    spec = root / "spark-pipeline.yml"
    spec.write_text(spec.read_text() + f"database: {database}\n")
    monkeypatch.chdir(root)

    # Newer than every customers event: applied, it would win key 1.
    other_table = (
        '{"op":"c","before":null,"after":{"id":1,"name":"x","city":"y"},"source":{"schema":'
        '"public","table":"suppliers","sequence":"[null,\\"90000000\\"]","lsn":90000000}}'
    )
    for i, name in enumerate(sorted((tmp_path / "events").iterdir())):
        values = [line or None for line in name.read_text().splitlines()]
        if i == 1:
            values += ['{"schema": null, "payload": null}', other_table]
        produce(spark, broker.servers, values)
        run(spark, spec)

    loader = importlib.util.spec_from_file_location("debezium_check", root / "check.py")
    check = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(check)
    customers = spark.table(f"{database}.customers").orderBy("id").collect()
    assert [tuple(r) for r in customers] == check.CUSTOMERS
    quarantine = spark.table(f"{database}.customers__autocdc_quarantine").collect()
    assert [r.reason for r in quarantine] == ["AUTOCDC_MALFORMED_RECORD"]
