-- The product catalogue as a full export, data/products.json, replaced in place: each run
-- reads it whole as the next snapshot of `products` (SCD type 1). A view is numbered by
-- run (a Delta table would be versioned by its own commits, and an unchanged one skipped).
CREATE TEMPORARY VIEW products_export AS SELECT * FROM json.`data/products.json`;

CREATE OR REFRESH STREAMING TABLE products;

CREATE FLOW products_snapshots AS AUTO CDC INTO products
FROM SNAPSHOT products_export
KEYS (sku);
