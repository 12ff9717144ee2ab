"""The order system's side of `orders` (SCD type 1): full rows of every order change.

The warehouse's shipping updates and the backfill are in shipping.sql. Three flows write
one table: they share its keys and its state, and because the warehouse sends partial
upserts (only the shipping columns), every flow into `orders` treats it as a partial
target: an upsert sets the columns its own feed carries and leaves the others as they
are. Sequences are the producers' event times in UTC, one clock for both.
"""

from autocdc import pipelines as dp

ORDER_ROWS = (
    "order_id BIGINT, customer STRING, status STRING, amount DECIMAL(10,2), "
    "op STRING, updated_at TIMESTAMP"
)


@dp.temporary_view
def shop_changes():
    return spark.readStream.schema(ORDER_ROWS).json("data/shop")  # noqa: F821 - `spark` is a global


@dp.temporary_view
def shipping_changes():
    """One row per scan: `updated_fields` lists the columns it sets (NULL: both)."""
    return spark.readStream.schema(  # noqa: F821
        "order_id BIGINT, shipped_at TIMESTAMP, carrier STRING, scanned_at TIMESTAMP, "
        "updated_fields ARRAY<STRING>"
    ).json("data/shipping")


@dp.temporary_view
def backfill():
    """An export of older orders, read once as a batch (see the ONCE flow)."""
    return spark.read.schema(ORDER_ROWS).json("data/backfill")  # noqa: F821


dp.create_streaming_table("orders")
dp.create_auto_cdc_flow(
    target="orders",
    source="shop_changes",
    name="orders_from_shop",
    keys=["order_id"],
    sequence_by="updated_at",
    apply_as_deletes="op = 'D'",
    except_column_list=["op", "updated_at"],
)
