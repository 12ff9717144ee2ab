"""Debezium events through Kafka against the same changes from a Delta change table.

    python benchmarks/kafka.py                     # 1M events, 3 rounds each
    python benchmarks/kafka.py --events 100000 --rounds 2

A throwaway Kafka broker (the tests' KRaft node, from Maven's jars) gets a topic of
``--events`` Debezium PostgreSQL events (bare JSON envelopes, as the JSON converter writes
them with ``schemas.enable=false``) over a quarter as many keys: inserts, updates and one
delete in ten, each at its own LSN. The same events, parsed once by
:func:`autocdc.debezium_changes`, are written to a Delta table of change rows. Each round
applies all of them to an empty SCD type 1 target in one batch, once from the topic
(read, parsed and applied: what a pipeline's micro-batch over the topic does) and once
from the Delta table, in turn. Prints JSON: median seconds and events per second of each
path, and their ratio.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

import autocdc

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))
from kafkaserver import Broker  # the tests' throwaway broker

TOPIC = "bench.public.items"
ROW = "id INT, name STRING, qty INT"


def produce(spark: SparkSession, servers: str, events: int) -> None:
    """``events`` Debezium envelopes over ``events // 4`` keys, in LSN order."""
    keys = max(1, events // 4)
    n = F.col("id")
    key = (n % keys).cast("int")
    image = F.struct(key.alias("id"), F.concat(F.lit("item "), n).alias("name"),
                     (n % 97).cast("int").alias("qty"))  # fmt: skip
    lsn = (F.lit(1_000_000) + n * 8).cast("string")
    source = F.struct(
        F.lit("public").alias("schema"),
        F.lit("items").alias("table"),
        F.to_json(F.array(F.lit(None).cast("string"), lsn)).alias("sequence"),
        lsn.cast("long").alias("lsn"),
    )
    delete = (n % 10 == 9) & (n >= keys)
    envelope = F.struct(
        F.when(delete, "d").when(n < keys, "c").otherwise("u").alias("op"),
        F.when(delete, image).alias("before"),
        F.when(~delete, image).alias("after"),
        source.alias("source"),
    )
    values = spark.range(events).select(F.to_json(envelope).alias("value"))
    values.write.format("kafka").option("kafka.bootstrap.servers", servers).option(
        "topic", TOPIC
    ).save()


def from_kafka(spark: SparkSession, servers: str):
    events = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", servers)
        .option("subscribe", TOPIC)
        .option("startingOffsets", "earliest")
        .load()
    )
    return autocdc.debezium_changes(events, ROW, "postgresql")


def apply(spark: SparkSession, changes, target: str) -> float:
    """Seconds to apply ``changes`` to a fresh SCD type 1 ``target``."""
    flow = autocdc.AutoCdcFlow(target=target, keys=["id"])
    flow.full_refresh(spark)
    start = time.perf_counter()
    flow.apply(changes)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    broker = Broker().start()
    try:
        with tempfile.TemporaryDirectory(prefix="autocdc-bench-kafka-") as scratch:
            spark = autocdc.spark_session(Path(scratch) / "warehouse")
            started = time.perf_counter()
            produce(spark, broker.servers, args.events)
            produced = time.perf_counter() - started
            from_kafka(spark, broker.servers).write.format("delta").saveAsTable("changes")
            apply(spark, from_kafka(spark, broker.servers), "warm")  # class loading, codegen
            times: dict[str, list[float]] = {"kafka": [], "delta": []}
            for _ in range(args.rounds):
                times["kafka"].append(apply(spark, from_kafka(spark, broker.servers), "t"))
                times["delta"].append(apply(spark, spark.read.table("changes"), "t"))
            live = spark.read.table("t").count()
            results = {
                path: {
                    "seconds": [round(t, 2) for t in got],
                    "median_s": round(statistics.median(got), 2),
                    "events_per_s": round(args.events / statistics.median(got)),
                }
                for path, got in times.items()
            }
            results["kafka_vs_delta"] = round(
                results["kafka"]["median_s"] / results["delta"]["median_s"], 2
            )
            results.update(events=args.events, live_rows=live, produce_s=round(produced, 2))
            print(json.dumps(results, indent=2))
            spark.stop()
            shutil.rmtree(Path(scratch) / "warehouse", ignore_errors=True)
    finally:
        broker.stop()


if __name__ == "__main__":
    main()
