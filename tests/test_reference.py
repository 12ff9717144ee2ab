"""The reference model reproduces the worked example of docs/semantics.md (no Spark)."""

from __future__ import annotations

from reference import DELETE, TRUNCATE, UPSERT, Change, fold_scd1, fold_scd2

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


def test_worked_example_type2():
    assert fold_scd2(EXAMPLE) == {
        (123, ("Isabel", "Monterrey"), 1, 5),
        (123, ("Isabel", "Chihuahua"), 5, 6),
        (124, ("Raul", "Oaxaca"), 1, None),
        (125, ("Mercedes", "Tijuana"), 2, 5),
        (125, ("Mercedes", "Mexicali"), 5, 6),
        (125, ("Mercedes", "Guadalajara"), 6, None),
        (126, ("Lily", "Cancun"), 2, None),
    }


def test_worked_example_type2_city_untracked():
    assert fold_scd2(EXAMPLE, tracked=[0]) == {
        (123, ("Isabel", "Chihuahua"), 1, 6),
        (124, ("Raul", "Oaxaca"), 1, None),
        (125, ("Mercedes", "Guadalajara"), 2, None),
        (126, ("Lily", "Cancun"), 2, None),
    }


def test_type2_upsert_and_delete_at_one_sequence_is_not_stored():
    changes = [Change(1, 1, UPSERT, ("a",)), Change(1, 2, UPSERT, ("b",)), Change(1, 2, DELETE)]
    assert fold_scd2(changes) == {(1, ("a",), 1, 2)}
