"""The reference model reproduces the worked example of SEMANTICS.md (no Spark)."""

from __future__ import annotations

from reference import DELETE, TRUNCATE, UPSERT, Change, fold_scd1

EXAMPLE = [
    Change(124, 1, UPSERT, ("Raul", "Oaxaca")),
    Change(123, 1, UPSERT, ("Isabel", "Monterrey")),
    Change(125, 2, UPSERT, ("Mercedes", "Tijuana")),
    Change(126, 2, UPSERT, ("Lily", "Cancun")),
    Change(123, 6, DELETE),
    Change(125, 6, UPSERT, ("Mercedes", "Guadalajara")),
    Change(125, 5, UPSERT, ("Mercedes", "Mexicali")),
    Change(123, 5, UPSERT, ("Isabel", "Chihuahua")),
]


def test_worked_example_type1():
    assert fold_scd1(EXAMPLE) == {
        124: ("Raul", "Oaxaca"),
        125: ("Mercedes", "Guadalajara"),
        126: ("Lily", "Cancun"),
    }


def test_worked_example_truncate():
    assert fold_scd1([*EXAMPLE, Change(None, 3, TRUNCATE)]) == {125: ("Mercedes", "Guadalajara")}


def test_tie_greatest_row_wins_nulls_lowest():
    changes = [Change(1, 1, UPSERT, ("a", None)), Change(1, 1, UPSERT, ("a", 0))]
    assert fold_scd1(changes) == {1: ("a", 0)}


def test_delete_after_upsert_at_equal_sequence():
    assert fold_scd1([Change(1, 1, DELETE), Change(1, 1, UPSERT, ("a",))]) == {}


def test_ignore_null_updates_partial_and_late_delete():
    changes = [
        Change(1, 1, UPSERT, ("a", 1)),
        Change(1, 3, UPSERT, (None, 2)),
        Change(1, 2, DELETE),  # wipes "a", set before it
    ]
    assert fold_scd1(changes, ignore_null_updates=True) == {1: (None, 2)}
    assert fold_scd1(changes[:2], ignore_null_updates=True) == {1: ("a", 2)}
