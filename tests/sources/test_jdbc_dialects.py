"""The SQL a ``url`` source writes, per database: a limit's edge in each dialect's way of
taking the first rows (SQL Server and Oracle have no ``LIMIT``), and the whole scope as a
predicate every database takes. No server: the forms SQLite knows run in Python's."""

from __future__ import annotations

import sqlite3

import pytest

from autocdc.sources.extract import Batch
from autocdc.sources.jdbcextract import dialect, edge_sql, predicate

TABLE, COLUMN, BEYOND = '"shop"."orders"', '"at"', '"at" > 3'


@pytest.mark.parametrize(
    ("url", "inner"),
    [
        (
            "jdbc:postgresql://db/shop",
            'SELECT "at" AS v FROM "shop"."orders" WHERE "at" > 3 ORDER BY v ASC LIMIT 5',
        ),
        (
            "jdbc:mariadb://db:3306/shop",
            'SELECT "at" AS v FROM "shop"."orders" WHERE "at" > 3 ORDER BY v ASC LIMIT 5',
        ),
        (
            "jdbc:sqlite:/data/shop.db",
            'SELECT "at" AS v FROM "shop"."orders" WHERE "at" > 3 ORDER BY v ASC LIMIT 5',
        ),
        (
            "jdbc:sqlserver://db:1433;databaseName=shop",
            'SELECT TOP (5) "at" AS v FROM "shop"."orders" WHERE "at" > 3 ORDER BY v ASC',
        ),
        (
            "jdbc:oracle:thin:@//db:1521/shop",
            'SELECT "at" AS v FROM "shop"."orders" WHERE "at" > 3 ORDER BY v ASC '
            "FETCH FIRST 5 ROWS ONLY",
        ),
        (
            "jdbc:db2://db:50000/shop",
            'SELECT "at" AS v FROM "shop"."orders" WHERE "at" > 3 ORDER BY v ASC '
            "FETCH FIRST 5 ROWS ONLY",
        ),
    ],
)
def test_the_edge_query_is_written_in_each_dialect(url, inner):
    sql = edge_sql(dialect(url), TABLE, COLUMN, BEYOND, 5, descending=False)
    assert sql == f"SELECT max(v) AS v FROM ({inner}) edge"


def test_a_database_not_known_gets_row_number_and_descending_takes_the_least():
    sql = edge_sql(dialect("jdbc:teradata://db/shop"), TABLE, COLUMN, BEYOND, 5, True)
    assert sql == (
        'SELECT min(v) AS v FROM (SELECT "at" AS v, ROW_NUMBER() OVER (ORDER BY "at" DESC) '
        'AS n FROM "shop"."orders" WHERE "at" > 3) edge WHERE n <= 5'
    )
    assert "LIMIT" not in edge_sql("sqlserver", TABLE, COLUMN, BEYOND, 5, True)
    assert "LIMIT" not in edge_sql("oracle", TABLE, COLUMN, BEYOND, 5, True)


@pytest.mark.parametrize("descending", [False, True])
@pytest.mark.parametrize("rows", [1, 3, 4, 6, 50])
def test_the_limit_and_row_number_forms_find_the_same_edge(rows, descending):
    """Ties at the edge, NULLs, fewer rows than the limit: both forms give the edge the
    limit's definition says (the rows-th value past the checkpoint, in order)."""
    values = [7, 5, 5, 5, 9, None, 2, 8, 8, 1]
    db = sqlite3.connect(":memory:")
    db.execute('CREATE TABLE "orders" ("at" INT)')
    db.executemany('INSERT INTO "orders" VALUES (?)', [(v,) for v in values])
    beyond = '"at" < 8' if descending else '"at" > 1'
    kept = sorted(
        (v for v in values if v is not None and (v < 8 if descending else v > 1)),
        reverse=descending,
    )
    expected = kept[min(rows, len(kept)) - 1]
    for form in ("sqlite", "unknown"):
        sql = edge_sql(form, '"orders"', '"at"', beyond, rows, descending)
        assert db.execute(sql).fetchone()[0] == expected, sql


def test_the_whole_scope_is_a_predicate_every_database_takes():
    assert predicate(Batch()) == "1 = 1"
    assert predicate(Batch().narrowed("region = 'eu'")) == "region = 'eu'"
    assert predicate(Batch('"at" >= %s', ("2024-05-01",))) == "\"at\" >= '2024-05-01'"
