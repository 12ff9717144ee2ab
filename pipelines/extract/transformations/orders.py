"""The `shop` database's `orders` table, mirrored twice by querying it (no replication log).

`orders_src` (WATERMARK) reads the rows whose `updated_at` reached the last run's greatest,
in two partitions read at once, staged in files: the `orders` table (SCD type 1).
`orders_by_region` (CUSTOM) keeps one watermark per region, so a region whose writers'
clock lags the others' is never skipped: the `orders_history` table (SCD type 2).
A soft delete (`deleted = true`, with `updated_at` moved on) deletes the key.
"""

import os

from autocdc import pipelines as dp

DSN = os.environ.get("AUTOCDC_POSTGRES_DSN", "host=127.0.0.1 port=5432 dbname=shop user=postgres")
# Both flows: a row is its id, its versions ordered by updated_at; a soft delete deletes it.
MIRROR = {
    "keys": ["id"],
    "sequence_by": "updated_at",
    "apply_as_deletes": "deleted",
    "except_column_list": ["deleted"],
}

dp.create_extraction_source(
    name="orders_src",
    dsn=DSN,
    table="public.orders",
    cdc_order=["updated_at"],
    partitions=["id % 2 = 0", "id % 2 = 1"],  # each keeps updated_at >= checkpoint
    options=dp.ExtractionOptions(max_concurrency=2, staging=True),
)
dp.create_streaming_table("orders")
dp.create_auto_cdc_flow(target="orders", source="orders_src", **MIRROR)


class RegionCursor:
    """A CUSTOM cursor: the checkpoint maps each region to the greatest `updated_at` read
    in it. One batch per known region reads from its own mark, one more reads the regions
    not seen yet; a batch's accumulator is the marks it saw, and merging two keeps each
    region's greater mark (associative and commutative, as the batches are read at once)."""

    def batches(self, checkpoint):
        marks = checkpoint or {}
        known = [
            dp.ExtractionBatch("region = %s AND updated_at >= %s", (region, mark))
            for region, mark in sorted(marks.items())
        ]
        return [*known, dp.ExtractionBatch("NOT (region = ANY(%s))", (sorted(marks),))]

    def seed(self, checkpoint):
        return dict(checkpoint or {})

    def fold(self, acc, row):
        region, at = row["region"], row["updated_at"]  # ISO text in UTC: sorts as time
        acc[region] = max(acc.get(region, at), at)
        return acc

    def merge(self, a, b):
        return {r: max(m for m in (a.get(r), b.get(r)) if m is not None) for r in a.keys() | b}


dp.create_extraction_source(
    name="orders_by_region",
    dsn=DSN,
    table="public.orders",
    strategy="CUSTOM",
    cursor=RegionCursor,
)
dp.create_streaming_table("orders_history")
dp.create_auto_cdc_flow(
    target="orders_history", source="orders_by_region", stored_as_scd_type=2, **MIRROR
)
