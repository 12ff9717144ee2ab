-- The warehouse's partial upserts: each scan sets the columns its `updated_fields`
-- lists (NULL: every column it carries), ordered by when it was scanned. A column it
-- does not set keeps the value of the latest change that set it, whichever producer.
CREATE FLOW orders_shipping AS AUTO CDC INTO orders
FROM STREAM(shipping_changes)
KEYS (order_id)
SEQUENCE BY scanned_at
COLUMNS * EXCEPT (scanned_at)
COLUMNS TO UPDATE updated_fields;

-- Older orders, exported once: applied by the first run and after a full refresh of
-- `orders` only, beside the streaming flows; the engine orders them by their own times.
CREATE FLOW orders_backfill AS AUTO CDC ONCE INTO orders
FROM backfill
KEYS (order_id)
APPLY AS DELETE WHEN op = 'D'
SEQUENCE BY updated_at
COLUMNS * EXCEPT (op, updated_at);
