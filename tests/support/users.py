"""The users feed of docs/semantics.md's worked example, its flows and their checks."""

from __future__ import annotations

from chispa import assert_df_equality
from reference import DELETE, UPSERT, Change

import autocdc

SCHEMA = "userId int, name string, city string, operation string, sequenceNum long"
VERSIONS = "userId int, name string, city string, __START_AT long, __END_AT long"
EXAMPLE = [
    (124, "Raul", "Oaxaca", "INSERT", 1),
    (123, "Isabel", "Monterrey", "INSERT", 1),
    (125, "Mercedes", "Tijuana", "INSERT", 2),
    (126, "Lily", "Cancun", "INSERT", 2),
    (123, None, None, "DELETE", 6),
    (125, "Mercedes", "Guadalajara", "UPDATE", 6),
    (125, "Mercedes", "Mexicali", "UPDATE", 5),
    (123, "Isabel", "Chihuahua", "UPDATE", 5),
]
EXPECTED = [(124, "Raul", "Oaxaca"), (125, "Mercedes", "Guadalajara"), (126, "Lily", "Cancun")]
# A first batch with one change per key (folded row by row), then one that tests what it
# stored.
SOLE_FIRST = [
    (1, "a", "x", "INSERT", 10),
    (2, "b", "x", "INSERT", 10),
    (3, None, None, "DELETE", 10),  # a tombstone
    (4, "d", "x", "INSERT", 10),
    (5, "e", None, "INSERT", 10),
]
SOLE_SECOND = [
    (1, "a2", "x", "UPDATE", 10),  # ties the stored sequence: the greater row wins
    (2, "b", "x", "UPDATE", 10),  # the same change again
    (3, "c", "x", "INSERT", 5),  # below its delete: dead
    (4, "d0", "x", "UPDATE", 5),  # late
    (5, None, "y", "UPDATE", 20),
    (6, "f", "x", "INSERT", 1),
]


def users_flow(target: str, **overrides) -> autocdc.AutoCdcFlow:
    spec = {
        "target": target,
        "keys": ["userId"],
        "sequence_by": "sequenceNum",
        "apply_as_deletes": "operation = 'DELETE'",
        "except_column_list": ["operation", "sequenceNum"],
    }
    return autocdc.AutoCdcFlow(**{**spec, **overrides})


def history_flow(target: str, **overrides) -> autocdc.AutoCdcFlow:
    return users_flow(target, **{"stored_as_scd_type": 2, **overrides})


def assert_target(spark, target, rows, schema="userId int, name string, city string") -> None:
    expected = spark.createDataFrame(rows, schema)
    assert_df_equality(spark.table(target), expected, ignore_row_order=True, ignore_nullable=True)


def operations(spark, target: str) -> list[str]:
    """The operations of the target's commits after its creation, oldest first."""
    history = spark.sql(f"DESCRIBE HISTORY {target}").orderBy("version").collect()
    return [h.operation for h in history[1:]]


def assert_versions(spark, target, rows) -> None:
    assert_target(spark, target, rows, VERSIONS)


def as_changes(rows: list[tuple]) -> list[Change]:
    """``(key, name, city, operation, sequence)`` rows as the reference fold's changes."""
    return [
        Change(k, s, DELETE, ()) if op == "DELETE" else Change(k, s, UPSERT, (n, c))
        for k, n, c, op, s in rows
    ]
