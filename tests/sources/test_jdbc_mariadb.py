"""Extraction from a real MariaDB server (tests/support/mariadbserver.py) through JDBC: a
SQL-declared WATERMARK pipeline (soft deletes, a row rewritten in one tick, partitions on
the executors, the password from the environment) and a STATELESS snapshot flow (hard
deletes). The read path is the one tests/sources/test_jdbc_extract.py checks on SQLite."""

from __future__ import annotations

from decimal import Decimal

import pytest
from mariadbserver import READER_PASSWORD, start
from projects import run, write_project

from autocdc.pipelines.declare import project
from autocdc.pipelines.operations import overview


@pytest.fixture(scope="module")
def mariadb(tmp_path_factory):
    with start(tmp_path_factory.mktemp("mariadb")) as server:
        yield server


WATERMARK = """
CREATE EXTRACTION SOURCE items_src FROM shop.items
  CONNECTION '{url}'
  ORDER BY updated_at
  OPTIONS (user = 'reader', password_env = 'SHOP_PASSWORD',
           partition_column = 'id', num_partitions = 3);
CREATE STREAMING TABLE items;
AUTO CDC INTO items FROM items_src KEYS (id) SEQUENCE BY updated_at
  APPLY AS DELETE WHEN deleted COLUMNS * EXCEPT (deleted);
CREATE STREAMING TABLE history;
AUTO CDC INTO history FROM items_src KEYS (id) SEQUENCE BY updated_at
  APPLY AS DELETE WHEN deleted COLUMNS * EXCEPT (deleted) STORED AS SCD TYPE 2;
"""


def test_a_sql_declared_watermark_source_mirrors_a_mariadb_table(
    spark, mariadb, tmp_path, new_table, monkeypatch
):
    """Three runs: the first reads every row (in 3 partitions of ``id``); then row 111 is
    rewritten at the same ``updated_at`` (a coarse clock) and row 2 soft-deleted; then
    nothing changes. Both targets end as the table holds its rows, the lag is 0, and
    the password of the read-only user is nowhere in the pipeline's storage."""
    monkeypatch.setenv("SHOP_PASSWORD", READER_PASSWORD)
    mariadb.sql(
        "CREATE TABLE items (id INT PRIMARY KEY, name VARCHAR(20), price DECIMAL(10,2), "
        "updated_at DATETIME(6), deleted BOOLEAN NOT NULL DEFAULT FALSE);"
        "INSERT INTO items (id, name, price, updated_at) VALUES "
        "(1, 'a', 1.50, '2026-01-01 07:00:00'), (2, 'it''s', NULL, '2026-01-01 07:30:00.25'),"
        "(111, 'x', 84.06, '2026-01-01 08:00:00')"
    )
    database = new_table("mariadb_mirror")
    root = tmp_path / "project"
    spec = write_project(
        root, database, {"items.sql": WATERMARK.replace("{url}", mariadb.jdbc_url)}
    )
    traffic = [
        "",
        "UPDATE items SET price = price * -1, updated_at = '2026-01-01 08:00:00' WHERE id = 111;"
        "UPDATE items SET deleted = TRUE, updated_at = '2026-01-01 08:00:01' WHERE id = 2",
        "",
    ]
    for sql in traffic:
        if sql:
            mariadb.sql(sql)
        run(spark, spec)
        live = sorted(
            (int(i), n, Decimal(p) if p else None)
            for i, n, p in mariadb.sql("SELECT id, name, price FROM items WHERE NOT deleted")
        )
        latest = spark.table(f"{database}.items").orderBy("id")
        assert [(r.id, r.name, r.price) for r in latest.collect()] == live
        current = spark.table(f"{database}.history").where("__END_AT IS NULL").orderBy("id")
        assert [(r.id, r.name, r.price) for r in current.collect()] == live
    assert live == [(1, "a", Decimal("1.50")), (111, "x", Decimal("-84.06"))]
    flows = overview.status(project.load(spec))["flows"]
    checkpoints = {f["extraction"]["checkpoint"]["updated_at"] for f in flows}
    assert checkpoints == {"2026-01-01 08:00:01.000000"}
    assert all(f["extraction"]["behind"] == {"updated_at": 0.0} for f in flows)
    written = [p.read_bytes() for p in (root / "storage").rglob("*") if p.is_file()]
    assert written and not any(READER_PASSWORD.encode() in w for w in written)


SNAPSHOT = """
from autocdc import pipelines as dp

dp.create_extraction_source(name="stock_src", url="{url}", table="stock",
                            strategy="STATELESS", user="reader", password_file="{secret}")
dp.create_streaming_table("stock")
dp.create_auto_cdc_from_snapshot_flow(target="stock", source="stock_src", keys=["sku"],
                                      max_delete_fraction=None)
"""


def test_a_snapshot_flow_over_a_stateless_mariadb_source_mirrors_hard_deletes(
    spark, mariadb, tmp_path, new_table
):
    mariadb.sql(
        "CREATE TABLE stock (sku VARCHAR(8) PRIMARY KEY, qty INT);"
        "INSERT INTO stock VALUES ('a', 1), ('b', 2), ('c', 3)"
    )
    secret = tmp_path / "password"
    secret.write_text(READER_PASSWORD + "\n")
    database = new_table("mariadb_snapshot")
    text = SNAPSHOT.replace("{url}", mariadb.jdbc_url).replace("{secret}", str(secret))
    spec = write_project(tmp_path / "project", database, {"stock.py": text})
    for sql in ["", "DELETE FROM stock WHERE sku = 'b'; UPDATE stock SET qty = 30 WHERE sku = 'c'"]:
        if sql:
            mariadb.sql(sql)
        run(spark, spec)
        rows = spark.table(f"{database}.stock").orderBy("sku").collect()
        live = [(s, int(q)) for s, q in mariadb.sql("SELECT sku, qty FROM stock ORDER BY sku")]
        assert [(r.sku, r.qty) for r in rows] == live
    assert live == [("a", 1), ("c", 30)]
