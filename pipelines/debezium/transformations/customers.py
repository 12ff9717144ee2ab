"""PostgreSQL `public.customers` through Debezium into `customers` (SCD type 1).

The events hold a snapshot, a transaction that committed after the snapshot although its
LSN is lower, interleaved transactions, a delete and its tombstone, a schema/payload
wrapped event delivered twice and out of order, and a logical decoding message (`op: m`)
that no table can apply: it goes to the quarantine with its raw text.
"""

import autocdc
from autocdc import pipelines as dp


@dp.temporary_view
def customer_changes():
    # From Kafka: spark.readStream.format("kafka")...load(), whose `value` is the event.
    events = spark.readStream.option("maxFilesPerTrigger", 1).text("data/postgres")  # noqa: F821
    return autocdc.debezium_changes(events, "id INT, name STRING, city STRING", "postgresql")


dp.create_streaming_table("customers")
# The change rows' `_CHANGE_TYPE` and `_CHANGE_SEQUENCE_NUMBER` drive the flow: no
# sequence_by or apply_as_deletes (see docs/sources.md, "BigQuery-style change rows").
dp.create_auto_cdc_flow(
    target="customers",
    source="customer_changes",
    keys=["id"],
)
