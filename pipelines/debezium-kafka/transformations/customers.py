"""PostgreSQL's `public.customers`, through Debezium's connector and Kafka, mirrored into
`customers` (SCD type 1) with its history in `customers_history` (SCD type 2).

The row's columns are taken from the events' schemas when a run begins; a column added to
the table while the pipeline runs is taken too (docs/sources.md). ``AUTOCDC_KAFKA``: the
broker's address, as servers.py prints it.
"""

import os

from autocdc import pipelines as dp

dp.create_debezium_source(
    name="customer_changes",
    bootstrap_servers=os.environ.get("AUTOCDC_KAFKA", "127.0.0.1:9092"),
    topics=["shop.public.customers"],
    connector="postgresql",
    transaction_id="txid",  # the PostgreSQL transaction of each change
)
dp.create_streaming_table("customers")
dp.create_auto_cdc_flow(target="customers", source="customer_changes", keys=["id"])
dp.create_streaming_table("customers_history")
dp.create_auto_cdc_flow(
    target="customers_history", source="customer_changes", keys=["id"], stored_as_scd_type=2
)
