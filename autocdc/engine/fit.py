"""Fit a batch to the flow's stored tables, before anything is written.

The stored definition (keys, the sequence's type, the SCD type) must match the declared
one: the state means something else under another. Whether the target is partial (its
state records which columns each upsert set) is fixed when the tables are created: a
flow with partial upserts is refused on a target created without, and a full-row flow
into a partial target is applied as one (its upserts set the columns its feed carries). Columns
evolve as docs/semantics.md allows: a batch may add nullable columns (they come last in the
stored order), leave stored columns out (they read NULL) and widen a type the way Delta
can; anything else is refused, naming the column and the change. The value columns are
the target's (the state table keeps none); ties compare them in the order the
declaration fixes (``column_list``, else sorted by name), never in a batch's or the
target's order, so no arrival order and no crash between two ALTERs can change a result.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    ByteType,
    DataType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StructField,
    StructType,
)

from autocdc.engine import change_rows, tables
from autocdc.engine import state as st
from autocdc.engine.errors import (
    DefinitionChangedError,
    SchemaMismatchError,
    SequenceGroupsError,
    TargetNotPartialError,
    UnknownColumnError,
)
from autocdc.engine.faults import crash_point
from autocdc.engine.spec import END_AT, START_AT, FlowDefinition
from autocdc.engine.stage import corrupt_column, sequence_type
from autocdc.engine.tables import col

_INTEGRAL = [ByteType(), ShortType(), IntegerType(), LongType()]


def nullable(data_type: DataType) -> DataType:
    """The same type with every nested field nullable: batches differ in nullability."""
    if isinstance(data_type, StructType):
        return StructType([StructField(f.name, nullable(f.dataType)) for f in data_type.fields])
    if isinstance(data_type, ArrayType):
        return ArrayType(nullable(data_type.elementType))
    if isinstance(data_type, MapType):
        return MapType(nullable(data_type.keyType), nullable(data_type.valueType))
    return data_type


def widens(old: DataType, new: DataType) -> bool:
    """Whether Delta's type widening takes a column of type ``old`` to ``new``."""
    if old in _INTEGRAL and new in _INTEGRAL:
        return _INTEGRAL.index(new) > _INTEGRAL.index(old)
    if isinstance(old, FloatType) and isinstance(new, DoubleType):
        return True
    if isinstance(old, DecimalType) and isinstance(new, DecimalType):
        return (
            new.scale >= old.scale
            and new.precision - new.scale >= old.precision - old.scale
            and new != old
        )
    return False


@dataclass(frozen=True)
class Fit:
    """What the batch means for the tables: the layout after evolution, and the change."""

    layout: st.Layout
    tracked: list[str]  # SCD type 2: value columns whose change opens a version
    target_columns: list[StructField]  # user columns of the target, in stored order
    creating: bool  # the tables do not exist yet
    evolving: bool  # columns to add or types to widen (in the target or the state)
    conform: list[Column]  # the batch's columns, cast to stored types, missing ones NULL
    sets: list[Column]  # partial target: per value column, whether an upsert sets it


def definition(spec: FlowDefinition, sequence: DataType) -> dict[str, str]:
    """What the stored state depends on, kept as properties of the state table."""
    declared = {
        st.PROP_KEYS: json.dumps(list(spec.keys)),
        st.PROP_SEQUENCE: sequence.simpleString(),
        st.PROP_SCD_TYPE: str(spec.stored_as_scd_type),
        st.PROP_PARTIAL: str(spec.partial).lower(),
    }
    if spec.sequence_groups is not None:  # each group's clock type: its state columns'
        declared[st.PROP_SEQUENCE] = st.GROUPS_SEQUENCE
        declared[st.PROP_GROUPS] = groups_text(spec)
    if spec.stored_as_scd_type == 2:
        hashes = _tracks_all(spec) and not spec.partial
        declared[st.PROP_LOG] = st.LOG_HASHES if hashes else st.LOG_VALUES
    return declared


def _tracks_all(spec: FlowDefinition) -> bool:
    """Whether a change of any value column, columns added later too, opens a version: on
    a target that is not partial, its SCD type 2 log can then keep hashes of the values
    instead of the values (see :mod:`autocdc.engine.scd2`)."""
    return spec.track_history_column_list is None and not spec.track_history_except_column_list


def groups_text(spec: FlowDefinition) -> str:
    """The flow's sequence groups as the state table stores them (order-free)."""
    groups = spec.sequence_groups or {}
    return json.dumps({g: list(groups[g]) for g in sorted(groups)})


def _check_groups(spec: FlowDefinition, had: dict[str, str]) -> None:
    """Every flow into a target with sequence groups declares the same groups (and a
    target without them takes no flow that declares some)."""
    stored = had.get(st.PROP_GROUPS)
    declared = None if spec.sequence_groups is None else groups_text(spec)
    if stored != declared:
        why = (
            f"target `{spec.target}` was built with sequence groups {stored or 'none'}, "
            f"the flow declares {declared or 'none'}"
        )
        raise SequenceGroupsError(flow=spec.flow_name, why=why)


def _group_types(
    spec: FlowDefinition, sequence: DataType, stored: StructType | None
) -> tuple[tuple[str, DataType], ...]:
    """Each group's clock type: the stored one (the type of its state columns), and the
    batch's for the flow's own group, which must agree with the stored one."""
    types: dict[str, DataType] = {}
    for group in sorted(spec.sequence_groups or {}):
        name = st.group_ups(group)
        if stored is not None and name in stored.names:
            types[group] = nullable(stored[name].dataType)
    own = spec.sequence_group
    if own is not None and own in types and types[own] != sequence:
        raise DefinitionChangedError(
            target=spec.target,
            field=f"the sequence type of group {own}",
            stored=types[own].simpleString(),
            declared=sequence.simpleString(),
            remedy=DefinitionChangedError.PYTHON_REMEDY,
        )
    if own is not None:
        types[own] = sequence
    return tuple(sorted(types.items()))


def _why_partial(spec: FlowDefinition) -> str:
    """The option that makes a flow's upserts partial, for the refusal's message."""
    for field in (
        "sequence_group",
        "columns_to_update",
        "ignore_null_updates",
        "ignore_null_updates_column_list",
        "ignore_null_updates_except_column_list",
    ):
        if getattr(spec, field) not in (None, False):
            return field
    return "partial_target"


def tie_order(spec: FlowDefinition, values: list[str]) -> list[str]:
    """The order ties compare value columns in: ``column_list``'s, else by name."""
    if spec.column_list is not None:
        return [c for c in spec.column_list if c in values]
    return sorted(values)


def fit(
    spark: SparkSession, spec: FlowDefinition, df: DataFrame, state_table: str, fresh: bool = False
) -> Fit:
    """Check the batch against the spec and the stored tables (or, ``fresh``, as for a new
    target); raise before any write."""
    sequence = nullable(sequence_type(df, spec))
    found = not fresh and tables.exists(spark, state_table)
    declared = definition(spec, sequence)
    partial = spec.partial
    log_hashes = st.stored_log_hashes(declared)
    stored: tuple[list[StructField], list[StructField]] | None = None
    target_fields = st.user_columns(tables.read(spark, spec.target).schema) if found else []
    stored_names = [f.name for f in target_fields]
    corrupt = corrupt_column(df)
    # The declaration against the batch first: a key the feed lacks is a typo to fix, not
    # a change of definition to refresh for.
    never_stored = [c for c in (corrupt, change_rows.NO_CHANGE) if c and c in df.columns]
    columns = spec.resolve(df.schema, sequence, stored_names, never_stored)
    if found:
        had = st.stored_definition(spark, state_table)
        _check_groups(spec, had)
        for field, prop in st.DEFINITION_FIELDS.items():
            if prop in had and had[prop] != declared[prop]:
                raise DefinitionChangedError(
                    target=spec.target,
                    field=field,
                    stored=had[prop],
                    declared=declared[prop],
                    remedy=DefinitionChangedError.PYTHON_REMEDY,
                )
        partial = st.stored_partial(had)
        if spec.sets_columns and not partial:
            raise TargetNotPartialError(
                flow=spec.flow_name,
                target=spec.target,
                why=_why_partial(spec),
                remedy=TargetNotPartialError.PYTHON_REMEDY,
            )
        log_hashes = st.stored_log_hashes(had)
        if log_hashes and not _tracks_all(spec):
            raise DefinitionChangedError(
                target=spec.target,
                field="tracked history columns",
                stored="all",
                declared="a track_history list",
                remedy=DefinitionChangedError.PYTHON_REMEDY,
            )
        key_names = st.stored_keys(had)
        stored = (
            sorted(
                (f for f in target_fields if f.name in key_names),
                key=lambda f: key_names.index(f.name),
            ),
            [f for f in target_fields if f.name not in key_names],
        )
    batch_types = {f.name: nullable(f.dataType) for f in df.schema.fields}

    if stored is None:
        fields = [StructField(c, batch_types[c]) for c in columns.payload]
        keys = [f for f in fields if f.name in columns.keys]
        keys.sort(key=lambda f: columns.keys.index(f.name))
        values = [f for f in fields if f.name not in columns.keys]
        target_columns = fields
        unknown = [c for c in spec.cluster_by or [] if c not in columns.payload]
        if unknown:
            raise UnknownColumnError(field="cluster_by", columns=unknown, available=columns.payload)
    else:
        keys, values, changes = _evolve(stored[0], stored[1], columns.payload, batch_types)
        if changes:
            raise SchemaMismatchError(target=spec.target, changed=changes)
        target_columns = [
            _retyped(f, keys + values)
            for f in target_fields + [f for f in values if f.name not in stored_names]
        ]

    layout = st.Layout(
        keys=keys,
        values=values,
        tie_order=tie_order(spec, [f.name for f in values]),
        sequence=sequence,
        partial=partial,
        log_values=spec.stored_as_scd_type == 2,
        log_hashes=log_hashes,
        **_grouping(spec, sequence, tables.read(spark, state_table).schema if found else None),
    )
    tracked = [c for c in columns.tracked if c in layout.value_names]
    if spec.track_history_column_list is None:  # all but the excepted: new columns too
        untracked = set(spec.track_history_except_column_list or [])
        tracked = [c for c in layout.value_names if c not in untracked]
    # Stored columns the batch carries are applied; the lists decide about new ones.
    conform = [
        (
            col(f.name).cast(f.dataType) if f.name in batch_types else F.lit(None).cast(f.dataType)
        ).alias(f.name)
        for f in layout.keys + layout.values
    ]
    # An upsert sets the columns its own feed carries, no other flow's.
    carried = set(columns.payload) & set(batch_types)
    sets = (
        [spec.sets(f.name, f.name in carried).alias(st.set_flag(f.name)) for f in layout.values]
        if partial
        else []
    )
    evolving = False
    if stored is not None:
        state_names = set(tables.read(spark, state_table).schema.names)
        evolving = (
            [f.name for f in stored[0] + stored[1]] != layout.key_names + layout.value_names
            or [f.dataType for f in stored[0] + stored[1]]
            != [f.dataType for f in layout.keys + layout.values]
            or not set(layout.schema().names) <= state_names
        )
    return Fit(
        layout=layout,
        tracked=tracked,
        target_columns=target_columns,
        creating=stored is None,
        evolving=evolving,
        conform=conform,
        sets=sets,
    )


def _grouping(spec: FlowDefinition, sequence: DataType, stored: StructType | None) -> dict:
    """The Layout fields of a target with sequence groups (none without)."""
    if spec.sequence_groups is None:
        return {}
    return {
        "group": spec.sequence_group,
        "group_of": tuple(sorted((c, g) for g, cs in spec.sequence_groups.items() for c in cs)),
        "group_types": _group_types(spec, sequence, stored),
    }


def _retyped(field: StructField, fields: list[StructField]) -> StructField:
    return next((f for f in fields if f.name == field.name), field)


def _evolve(
    stored_keys: list[StructField],
    stored_values: list[StructField],
    payload: list[str],
    batch_types: dict[str, DataType],
) -> tuple[list[StructField], list[StructField], list[str]]:
    """Stored columns (widened where the batch widens them) plus the batch's new ones."""
    changes: list[str] = []

    def merged(f: StructField) -> StructField:
        new = batch_types.get(f.name)
        if new is None or new == f.dataType or widens(new, f.dataType):
            return f  # absent (NULL), equal, or narrower: cast up to the stored type
        if widens(f.dataType, new):
            return StructField(f.name, new)
        changes.append(f"{f.name}: {f.dataType.simpleString()} -> {new.simpleString()}")
        return f

    keys = [merged(f) for f in stored_keys]
    values = [merged(f) for f in stored_values]
    known = {f.name for f in stored_keys + stored_values}
    values += [StructField(c, batch_types[c]) for c in payload if c not in known]
    return keys, values, changes


def stored_layout(spark: SparkSession, spec: FlowDefinition, state_table: str) -> st.Layout:
    """The layout of a flow's existing tables (for maintenance, without a batch)."""
    had = st.stored_definition(spark, state_table)
    keys = st.stored_keys(had)
    fields = st.user_columns(tables.read(spark, spec.target).schema)
    values = [f for f in fields if f.name not in keys]
    return st.Layout(
        keys=sorted((f for f in fields if f.name in keys), key=lambda f: keys.index(f.name)),
        values=values,
        tie_order=tie_order(spec, [f.name for f in values]),
        sequence=tables.read(spark, state_table).schema[st.UPS].dataType,
        partial=st.stored_partial(had),
        log_values=spec.stored_as_scd_type == 2,
        log_hashes=st.stored_log_hashes(had),
    )


def prepare_tables(
    spark: SparkSession, spec: FlowDefinition, fitted: Fit, state_table: str
) -> None:
    """Create the tables on the first batch (target first: the state table's existence
    means both exist), or evolve them to the batch's columns."""
    target_fields = list(fitted.target_columns)
    if spec.stored_as_scd_type == 2:
        seq = fitted.layout.sequence
        target_fields += [StructField(START_AT, seq), StructField(END_AT, seq)]
    if fitted.creating:
        tables.create(
            spark, spec.target, StructType(target_fields), spec.table_properties, spec.cluster_by
        )
        crash_point("after_target_create")
        st.create(spark, state_table, fitted.layout, definition(spec, fitted.layout.sequence))
    elif fitted.evolving:
        tables.evolve(spark, spec.target, target_fields, before=START_AT)
        tables.evolve(spark, state_table, fitted.layout.schema().fields, before=None)


def conformed(df: DataFrame, fitted: Fit) -> DataFrame:
    """``df`` with its keys and values cast to the stored types (missing ones NULL) and,
    on a partial target, each upsert's "sets" flags; its other columns as they are."""
    columns = set(fitted.layout.key_names + fitted.layout.value_names)
    return df.select(
        *[col(c) for c in df.columns if c not in columns], *fitted.conform, *fitted.sets
    )
