-- Every version of every order (SCD type 2) from the same feed: no SEQUENCE BY, no
-- APPLY AS DELETE WHEN. __START_AT and __END_AT hold the sequence as autocdc.hex_sequence
-- does (four numeric sections), so they order as the change sequence numbers do.
CREATE OR REFRESH STREAMING TABLE orders_history;

CREATE FLOW orders_history_cdc AS AUTO CDC INTO orders_history
FROM STREAM(order_changes)
KEYS (order_id)
STORED AS SCD TYPE 2;
