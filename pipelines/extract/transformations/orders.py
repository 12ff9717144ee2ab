"""The `shop` database's `orders` table, mirrored a second time by querying it (the first,
`orders_src` into `orders`, is declared in latest.sql).

`orders_by_region` (CUSTOM) keeps one watermark per region, so a region whose writers'
clock lags the others' is never skipped: the `orders_history` table (SCD type 2).
A soft delete (`deleted = true`, with `updated_at` moved on) deletes the key.
"""

import os

from autocdc import pipelines as dp

DSN = os.environ.get("AUTOCDC_POSTGRES_DSN", "host=127.0.0.1 port=5432 dbname=shop user=postgres")


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
    target="orders_history",
    source="orders_by_region",
    keys=["id"],
    sequence_by="updated_at",  # as latest.sql's flow: a row's versions by updated_at
    apply_as_deletes="deleted",  # a soft delete deletes the key
    except_column_list=["deleted"],
    stored_as_scd_type=2,
)
