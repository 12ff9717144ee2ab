"""Spec validation: no Spark session needed, errors asserted by class and params."""

from __future__ import annotations

import pytest
from pydantic import ValidationError
from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    DoubleType,
    LongType,
    StringType,
    StructField,
    StructType,
)

import autocdc
from autocdc.engine import state
from autocdc.engine.spec import FlowDefinition

BASE = {"target": "t", "keys": ["id"], "sequence_by": "seq"}


def spec(**overrides):
    return autocdc.AutoCdcFlow(**{**BASE, **overrides})


def test_defaults_match_create_auto_cdc_flow():
    flow = spec()
    assert flow.stored_as_scd_type == 1
    assert flow.ignore_null_updates is False
    assert flow.apply_as_deletes is None
    assert flow.state_table == "t__autocdc_state"
    assert flow.quarantine_table == "t__autocdc_quarantine"


def test_scd_type_accepts_string():
    assert spec(stored_as_scd_type="2").stored_as_scd_type == 2


@pytest.mark.parametrize("keys", [[], [""]])
def test_empty_keys(keys):
    with pytest.raises(autocdc.EmptyKeysError):
        spec(keys=keys)


def test_both_column_lists():
    with pytest.raises(autocdc.ConflictingColumnListsError) as err:
        spec(column_list=["id"], except_column_list=["x"])
    assert err.value.params == {"first": "column_list", "second": "except_column_list"}
    assert "AUTOCDC_CONFLICTING_COLUMN_LISTS" in str(err.value)


def test_both_track_history_lists():
    with pytest.raises(autocdc.ConflictingColumnListsError):
        spec(
            stored_as_scd_type=2,
            track_history_column_list=["a"],
            track_history_except_column_list=["b"],
        )


def test_keys_removed_by_selection():
    with pytest.raises(autocdc.KeyNotSelectedError) as err:
        spec(column_list=["name"])
    assert err.value.params == {"columns": ["id"], "field": "column_list"}
    with pytest.raises(autocdc.KeyNotSelectedError) as err:
        spec(except_column_list=["id", "op"])
    assert err.value.params == {"columns": ["id"], "field": "except_column_list"}


def test_truncates_with_scd2():
    with pytest.raises(autocdc.TruncateWithScd2Error):
        spec(stored_as_scd_type=2, apply_as_truncates="op = 'T'")


def test_track_history_needs_scd2():
    with pytest.raises(autocdc.TrackHistoryWithScd1Error):
        spec(track_history_column_list=["a"])


def test_unknown_fields_are_rejected():
    with pytest.raises(ValidationError, match="extra_forbidden"):
        spec(sequence="seq")


def test_spec_is_frozen():
    with pytest.raises(ValidationError):
        spec().keys = ["other"]


COLUMNS = StructType([StructField(c, StringType()) for c in ["id", "name", "op", "seq"]])


def test_resolve_orders_columns_like_column_list_else_source():
    resolved = FlowDefinition(**BASE, except_column_list=["op", "seq"]).resolve(COLUMNS, LongType())
    assert resolved.payload == ["id", "name"]
    resolved = FlowDefinition(**BASE, column_list=["name", "id"]).resolve(COLUMNS, LongType())
    assert resolved.payload == ["name", "id"]


def test_resolve_unknown_column():
    with pytest.raises(autocdc.UnknownColumnError) as err:
        FlowDefinition(**BASE, except_column_list=["opp"]).resolve(COLUMNS, LongType())
    assert err.value.params["field"] == "except_column_list"
    assert err.value.params["columns"] == ["opp"]


def test_resolve_unknown_key():
    with pytest.raises(autocdc.UnknownColumnError) as err:
        FlowDefinition(**{**BASE, "keys": ["ID"]}).resolve(COLUMNS, LongType())
    assert err.value.params["field"] == "keys"


@pytest.mark.parametrize(
    "bad", [DoubleType(), BooleanType(), StructType([StructField("a", DoubleType())])]
)
def test_resolve_non_orderable_sequence(bad):
    with pytest.raises(autocdc.InvalidSequenceTypeError) as err:
        FlowDefinition(**BASE).resolve(COLUMNS, bad)
    assert err.value.params == {"type": bad.simpleString()}


def test_resolve_struct_sequence_is_orderable():
    seq = StructType([StructField("a", LongType()), StructField("b", StringType())])
    assert FlowDefinition(**BASE).resolve(COLUMNS, seq).keys == ["id"]


@pytest.mark.parametrize("name", ["__START_AT", "__end_at", "__autocdc_seq"])
def test_resolve_reserved_column(name):
    with pytest.raises(autocdc.ReservedColumnError) as err:
        FlowDefinition(**BASE).resolve(
            StructType([*COLUMNS.fields, StructField(name, LongType())]), LongType()
        )
    assert err.value.params == {"columns": [name]}


def test_track_history_resolution():
    flow = FlowDefinition(
        **BASE,
        stored_as_scd_type=2,
        except_column_list=["op"],
        track_history_except_column_list=["name"],
    )
    assert flow.resolve(COLUMNS, LongType()).tracked == ["id", "seq"]


@pytest.mark.parametrize(
    ("overrides", "field", "columns"),
    [
        ({"keys": ["id", "ID"]}, "keys", ["ID", "id"]),
        ({"except_column_list": ["op", "op"]}, "except_column_list", ["op"]),
        ({"sequence_by": ["a", "a"]}, "sequence_by", ["a"]),
    ],
)
def test_duplicate_names(overrides, field, columns):
    with pytest.raises(autocdc.DuplicateColumnError) as err:
        spec(**overrides)
    assert err.value.params == {"field": field, "columns": columns}


@pytest.mark.parametrize(
    ("overrides", "columns"),
    [
        ({"track_history_column_list": ["id", "a"]}, ["id"]),
        ({"track_history_except_column_list": ["op"], "except_column_list": ["op"]}, ["op"]),
        ({"track_history_column_list": ["b"], "column_list": ["id", "a"]}, ["b"]),
    ],
)
def test_track_history_names_only_selected_value_columns(overrides, columns):
    with pytest.raises(autocdc.TrackHistoryColumnNotSelectedError) as err:
        spec(stored_as_scd_type=2, **overrides)
    assert err.value.params["columns"] == columns


@pytest.mark.parametrize("days", [-1, 1e9])
def test_retention_out_of_range(days):
    with pytest.raises(autocdc.InvalidRetentionError) as err:
        spec(tombstone_retention_days=days)
    assert err.value.params["value"] == days


@pytest.mark.parametrize(
    ("overrides", "second"),
    [
        (
            {"ignore_null_updates": True, "ignore_null_updates_column_list": []},
            "ignore_null_updates_column_list",
        ),
        (
            {
                "ignore_null_updates_column_list": ["a"],
                "ignore_null_updates_except_column_list": ["b"],
            },
            "ignore_null_updates_except_column_list",
        ),
    ],
)
def test_ignore_null_options_are_exclusive(overrides, second):
    with pytest.raises(autocdc.ConflictingIgnoreNullUpdatesError) as err:
        spec(**overrides)
    assert err.value.params["second"] == second


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"columns_to_update": ["a", "op"], "except_column_list": ["op"]}, "columns_to_update"),
        (
            {"ignore_null_updates_column_list": ["op"], "column_list": ["id", "a"]},
            "ignore_null_updates_column_list",
        ),
    ],
)
def test_partial_options_name_only_selected_columns(overrides, field):
    with pytest.raises(autocdc.ColumnNotSelectedError) as err:
        spec(**overrides)
    assert err.value.params == {"field": field, "columns": ["op"]}


def test_partial_flows_and_what_they_set():
    assert not spec().partial and spec(partial_target=True).partial
    listed = spec(columns_to_update=["id", "name"], ignore_null_updates_except_column_list=["op"])
    assert listed.partial and listed.sets_columns
    assert (listed.ignores_null("name"), listed.ignores_null("op")) == (True, False)
    assert spec(columns_to_update="cols").columns_to_update_column == "cols"
    with pytest.raises(autocdc.DuplicateColumnError):
        spec(columns_to_update=["name", "name"])


def test_resolve_columns_to_update():
    listing = StructType([*COLUMNS.fields, StructField("cols", ArrayType(StringType()))])
    flow = FlowDefinition(**BASE, columns_to_update="cols", except_column_list=["op", "seq"])
    assert flow.resolve(listing, LongType()).payload == ["id", "name"]  # never stored
    with pytest.raises(autocdc.InvalidColumnsToUpdateError) as err:
        FlowDefinition(**BASE, columns_to_update="name").resolve(COLUMNS, LongType())
    assert err.value.params == {"column": "name", "type": "string"}
    with pytest.raises(autocdc.UnknownColumnError) as err:
        FlowDefinition(**BASE, columns_to_update=["nme"]).resolve(COLUMNS, LongType())
    assert err.value.params["field"] == "columns_to_update"


@pytest.mark.parametrize(
    ("properties", "partial"),
    [
        ({"autocdc.partial": "true"}, True),
        ({"autocdc.partial": "false", "autocdc.ignoreNullUpdates": "true"}, False),
        ({"autocdc.ignoreNullUpdates": "true"}, True),  # written before partial upserts
        ({"autocdc.ignoreNullUpdates": "false"}, False),
    ],
)
def test_stored_partial(properties, partial):
    assert state.stored_partial(properties) is partial
