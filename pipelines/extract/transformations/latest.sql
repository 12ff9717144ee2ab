-- `orders_src` (WATERMARK) reads the rows whose `updated_at` reached the last run's
-- greatest, in two partitions read at once, staged in files: the `orders` table (SCD
-- type 1). The connection string comes from AUTOCDC_POSTGRES_DSN (no password in here).
-- A soft delete (`deleted = true`, with `updated_at` moved on) deletes the key.
CREATE EXTRACTION SOURCE orders_src FROM public.orders
  CONNECTION ENV 'AUTOCDC_POSTGRES_DSN'
  ORDER BY updated_at
  PARTITIONS ('id % 2 = 0', 'id % 2 = 1')  -- each keeps updated_at >= checkpoint
  OPTIONS (max_concurrency = 2, staging = true);

CREATE STREAMING TABLE orders;
AUTO CDC INTO orders FROM orders_src KEYS (id) SEQUENCE BY updated_at
  APPLY AS DELETE WHEN deleted COLUMNS * EXCEPT (deleted);
