"""The reference model reproduces the worked example of docs/semantics.md (no Spark)."""

from __future__ import annotations

from reference import DELETE, TRUNCATE, UPSERT, Change, fold_scd1, fold_scd1_groups, fold_scd2

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


# The partial upserts example: (status, amount) from the shop, (shipped_at, carrier) from
# the warehouse.
SHOP, SHIPPING, CARRIER = frozenset({0, 1}), frozenset({2, 3}), frozenset({3})
ORDERS = [
    Change(7, "10:00", UPSERT, ("paid", 30, None, None), SHOP),
    Change(7, "12:00", UPSERT, (None, None, "12:00", "DHL"), SHIPPING),
    Change(7, "13:00", UPSERT, (None, None, None, "FedEx"), CARRIER),
    Change(7, "12:05", UPSERT, ("shipped", 30, None, None), SHOP),
    Change(8, "09:10", UPSERT, ("placed", 8, None, None), SHOP),
    Change(8, "10:45", UPSERT, (None, None, "10:45", "DHL"), SHIPPING),
    Change(8, "11:00", DELETE),
    Change(8, "11:30", UPSERT, (None, None, None, "UPS"), CARRIER),
]


def test_partial_upserts_worked_example():
    assert fold_scd1(ORDERS) == {
        7: ("shipped", 30, "12:00", "FedEx"),
        8: (None, None, None, "UPS"),
    }
    assert {v for v in fold_scd2(ORDERS) if v[0] == 7} == {
        (7, ("paid", 30, None, None), "10:00", "12:00"),
        (7, ("paid", 30, "12:00", "DHL"), "12:00", "12:05"),
        (7, ("shipped", 30, "12:00", "DHL"), "12:05", "13:00"),
        (7, ("shipped", 30, "12:00", "FedEx"), "13:00", None),
    }


def test_partial_ties_merge_per_column_and_ignore_unset_values():
    tied = [
        Change(1, 2, UPSERT, ("a", 5), frozenset({0, 1})),
        Change(1, 2, UPSERT, ("b", 9), frozenset({0})),  # sets column 0 only: its 9 is no value
        Change(1, 1, UPSERT, ("z", 7), frozenset({1})),  # older: loses column 1 to the 5
    ]
    assert fold_scd1(tied) == {1: ("b", 5)}
    # A full-row target compares whole rows; a partial one merges columns, full rows too.
    full = [Change(1, 1, UPSERT, ("y", 0)), Change(1, 1, UPSERT, ("x", 1))]
    assert fold_scd1(full) == {1: ("y", 0)}
    assert fold_scd1(full, partial=True) == {1: ("y", 1)}


def test_sequence_groups_delete_wipes_only_its_group():
    """docs/semantics.md, sequence groups: the shop (status, amount) on hours, the
    warehouse (shipped_at, carrier) on scan numbers. Order 8: the shop's delete leaves the
    warehouse's columns, and a warehouse scan, whatever its number, is not below it.
    Order 9: the warehouse's delete wipes its scan 1, not its scan 3; the shop's late
    upsert below its own delete stays out. Order 10: both delete: gone."""
    shop = [
        Change(8, 9, UPSERT, ("placed", 8, None, None)),
        Change(8, 11, DELETE),
        Change(9, 10, UPSERT, ("paid", 5, None, None)),
        Change(9, 12, DELETE),
        Change(9, 11, UPSERT, ("late", 1, None, None)),
        Change(9, 13, UPSERT, ("again", 2, None, None)),
        Change(10, 9, UPSERT, ("placed", 1, None, None)),
        Change(10, 10, DELETE),
    ]
    warehouse = [
        Change(8, 1, UPSERT, (None, None, "10:45", "DHL")),
        Change(8, 2, UPSERT, (None, None, None, "UPS"), frozenset({3})),
        Change(9, 1, UPSERT, (None, None, "09:00", "DHL")),
        Change(9, 3, UPSERT, (None, None, None, "UPS"), frozenset({3})),
        Change(9, 2, DELETE),
        Change(10, 1, UPSERT, (None, None, "09:00", "DHL")),
        Change(10, 5, DELETE),
    ]
    groups = {"shop": [0, 1], "warehouse": [2, 3]}
    assert fold_scd1_groups({"shop": shop, "warehouse": warehouse}, groups, 4) == {
        8: (None, None, "10:45", "UPS"),
        9: ("again", 2, None, "UPS"),
    }
