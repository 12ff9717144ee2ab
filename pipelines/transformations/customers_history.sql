-- Every version of every customer (SCD type 2) from the same feed, and a summary view.
CREATE OR REFRESH STREAMING TABLE customers_history;

CREATE FLOW customers_history_cdc AS AUTO CDC INTO customers_history
FROM STREAM(customer_changes)
KEYS (id)
APPLY AS DELETE WHEN op = 'D'
SEQUENCE BY seq
COLUMNS * EXCEPT (op, seq)
STORED AS SCD TYPE 2;

CREATE MATERIALIZED VIEW customers_per_city AS
SELECT city, count(*) AS customers FROM customers GROUP BY city;
