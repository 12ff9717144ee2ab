-- The table the example extracts. Writers set updated_at on every insert and update
-- (UPDATE orders SET ..., updated_at = now()) and delete softly (deleted = true), never
-- with DELETE: a row that is gone cannot be read, so its deletion would never be seen.
CREATE TABLE orders (
  id bigint PRIMARY KEY,
  region text NOT NULL,
  status text,
  amount numeric(10,2),
  updated_at timestamptz NOT NULL DEFAULT now(),
  deleted boolean NOT NULL DEFAULT false
);
CREATE INDEX orders_updated_at ON orders (updated_at);
INSERT INTO orders (id, region, status, amount) VALUES
  (1, 'eu', 'new', 10.00), (2, 'eu', 'paid', 25.50), (3, 'us', 'new', 7.25),
  (4, 'us', 'shipped', 99.99), (5, 'apac', 'new', 12.00);
