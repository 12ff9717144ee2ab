"""The declarative part of a flow: what the user says, checked before Spark is touched.

Parameter names follow ``pyspark.pipelines.create_auto_cdc_flow`` and Databricks AUTO
CDC, so code moves over unchanged. Checks that need the change feed's schema (unknown
columns, the sequence's type) run in :func:`FlowDefinition.resolve`, before any data is read.
With no ``sequence_by`` the feed's own change columns drive the flow (see
:mod:`autocdc.engine.change_rows`).
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    DataType,
    DateType,
    DecimalType,
    FractionalType,
    IntegralType,
    MapType,
    StringType,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from autocdc.engine import change_rows, clock
from autocdc.engine.errors import (
    ColumnNotSelectedError,
    ConflictingColumnListsError,
    ConflictingIgnoreNullUpdatesError,
    DuplicateColumnError,
    EmptyKeysError,
    InvalidColumnsToUpdateError,
    InvalidKeyTypeError,
    InvalidMaxStalenessError,
    InvalidRetentionError,
    InvalidSequenceTypeError,
    KeyNotSelectedError,
    MaxStalenessUnsupportedError,
    ReservedColumnError,
    SequenceGroupsError,
    SnapshotSequenceError,
    TrackHistoryColumnNotSelectedError,
    TrackHistoryWithScd1Error,
    TruncateWithScd2Error,
    UnknownColumnError,
)
from autocdc.engine.tables import ident

RESERVED_PREFIX = "__autocdc"
START_AT = "__START_AT"
END_AT = "__END_AT"

ColumnOrSql = str | Column
# A hundred years: far beyond any sensible retention, far from date arithmetic overflow.
MAX_RETENTION_DAYS = 36_500
TRACK_HISTORY_LISTS = ("track_history_column_list", "track_history_except_column_list")
GROUP_NAME = re.compile(r"[A-Za-z0-9_]+")
IGNORE_NULL_LISTS = ("ignore_null_updates_column_list", "ignore_null_updates_except_column_list")
_INTERVAL_PART = re.compile(r"\s*(\d+(?:\.\d*)?)\s*([a-z]+)\s*")
_INTERVAL_UNITS = {
    "s": 1, "sec": 1, "secs": 1, "second": 1, "seconds": 1,
    "m": 60, "min": 60, "mins": 60, "minute": 60, "minutes": 60,
    "h": 3600, "hour": 3600, "hours": 3600,
    "d": 86400, "day": 86400, "days": 86400,
}  # fmt: skip


def parse_interval(value: object, field: str = "max_staleness") -> timedelta:
    """An interval as a ``timedelta``: a timedelta, a number of seconds, or text such as
    ``"10 minutes"``, ``"1 hour 30 minutes"`` or SQL's ``"INTERVAL 10 MINUTE"``."""
    seconds: float | None = None
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip().lower().removeprefix("interval").strip().replace("'", "")
        parts, at = [], 0
        while at < len(text):
            found = _INTERVAL_PART.match(text, at)
            if found is None or found.group(2) not in _INTERVAL_UNITS:
                parts = []
                break
            parts.append(float(found.group(1)) * _INTERVAL_UNITS[found.group(2)])
            at = found.end()
        seconds = sum(parts) if parts else None
    if seconds is None or seconds < 0:
        raise InvalidMaxStalenessError(field=field, value=value, what="an interval")
    return timedelta(seconds=seconds)


def is_reserved(name: str) -> bool:
    return name.lower().startswith(RESERVED_PREFIX) or name.upper() in (START_AT, END_AT)


def is_orderable_sequence(data_type: DataType) -> bool:
    """Types whose order is total and meaningful for sequencing changes."""
    if isinstance(data_type, StructType):
        return bool(data_type.fields) and all(
            is_orderable_sequence(f.dataType) for f in data_type.fields
        )
    return isinstance(
        data_type,
        IntegralType | DecimalType | DateType | TimestampType | TimestampNTZType | StringType,
    )


def has_map(data_type: DataType) -> bool:
    """Maps have no equality or order in Spark: they compare as JSON where needed."""
    if isinstance(data_type, MapType):
        return True
    if isinstance(data_type, StructType):
        return any(has_map(f.dataType) for f in data_type.fields)
    if isinstance(data_type, ArrayType):
        return has_map(data_type.elementType)
    return False


def is_unreliable_key(data_type: DataType) -> bool:
    """Floating point (NaN, -0.0) and map values make poor row identities."""
    if isinstance(data_type, StructType):
        return any(is_unreliable_key(f.dataType) for f in data_type.fields)
    if isinstance(data_type, ArrayType):
        return is_unreliable_key(data_type.elementType)
    if isinstance(data_type, MapType):
        return True
    return isinstance(data_type, FractionalType) and not isinstance(data_type, DecimalType)


def scd_type_from_str(value: object) -> object:
    """``"1"`` and ``"2"`` as the SCD type they name (Databricks takes either form)."""
    return int(value) if isinstance(value, str) and value.strip() in ("1", "2") else value


def to_column(value: ColumnOrSql) -> Column:
    return value if isinstance(value, Column) else F.expr(value)


@dataclass(frozen=True)
class ResolvedColumns:
    """The flow's columns for one change-feed schema."""

    keys: list[str]
    payload: list[str]  # target columns, keys included (column_list order, else source order)
    tracked: list[str]  # SCD type 2: columns whose change opens a new version


class FlowDefinition(BaseModel):
    """What a flow does, as its user declares it: immutable, validated once, on
    construction, and holding no runtime state. The running flow
    (:class:`~autocdc.engine.flow.AutoCdcFlow`) is built from it by
    :meth:`AutoCdcFlow.of <autocdc.engine.flow.AutoCdcFlow.of>`.

    >>> FlowDefinition(target="customers", keys="id", sequence_by="seq").keys
    ['id']
    """

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)

    target: str = Field(min_length=1, description="Target table, `table` or `db.table`.")
    keys: list[str] = Field(description="Columns that identify a row.")
    sequence_by: str | list[str] | Column | None = Field(
        default=None,
        description="Column name, SQL expression, Column, or list of columns compared left "
        "to right (a struct sequence). None: the feed's BigQuery-style "
        "`_CHANGE_SEQUENCE_NUMBER` (and `_CHANGE_TYPE`), see autocdc.engine.change_rows.",
    )
    apply_as_deletes: str | Column | None = Field(
        default=None, description="SQL expression or Column: true for a DELETE change."
    )
    apply_as_truncates: str | Column | None = Field(
        default=None, description="SQL expression or Column: true for a TRUNCATE (type 1 only)."
    )
    apply_as_upserts: str | Column | None = Field(
        default=None,
        description="SQL expression or Column: true for an upsert. Unset, a row that is no "
        "delete or truncate is an upsert; set, such a row that is no upsert either (an "
        "unknown change type) is quarantined as AUTOCDC_UNKNOWN_CHANGE_TYPE.",
    )
    column_list: list[str] | None = None
    except_column_list: list[str] | None = None
    stored_as_scd_type: Literal[1, 2] = 1
    ignore_null_updates: bool = Field(
        default=False, description="A NULL in an upsert keeps the column's current value."
    )
    ignore_null_updates_column_list: list[str] | None = Field(
        default=None, description="As ignore_null_updates, for these columns only."
    )
    ignore_null_updates_except_column_list: list[str] | None = Field(
        default=None, description="As ignore_null_updates, for all columns but these."
    )
    columns_to_update: list[str] | str | None = Field(
        default=None,
        description="The columns the flow's upserts set (keys implied), or the name of an "
        "array<string> column of the feed that lists, per row, the columns that row sets "
        "(NULL: every column). The columns an upsert does not set keep their values.",
    )
    partial_target: bool = Field(
        default=False,
        description="autocdc: the target takes partial upserts, from this flow or another "
        "flow into it, so its state records which columns each upsert set. Implied by "
        "columns_to_update and the ignore-null options; declare it on full-row flows into "
        "a target another flow updates partially (a pipeline does that for you).",
    )
    snapshot_target: bool = Field(
        default=False,
        description="autocdc: a snapshot flow with `sequence_by` also writes the target "
        "(SCD type 1): the flow's sequences then sit on the clock it shares with the "
        "snapshots (see autocdc.engine.clock). Declare it on every change flow into "
        "such a target (a pipeline does that for you).",
    )
    sequence_groups: dict[str, list[str]] | None = Field(
        default=None,
        description="autocdc: the target's sequence groups, each a name and the value "
        "columns it orders, every value column in one group; the same on every flow into "
        "the target. With sequence_group: columns ordered by different clocks.",
    )
    sequence_group: str | None = Field(
        default=None,
        description="autocdc: the sequence group this flow feeds: its sequence_by is the "
        "group's clock, its upserts set the group's columns only, its deletes wipe them.",
    )
    track_history_column_list: list[str] | None = None
    track_history_except_column_list: list[str] | None = None
    tombstone_retention_days: float = Field(
        default=7.0, description="How long a delete is remembered to reject older upserts."
    )
    late_beyond_horizon: Literal["quarantine", "apply"] = Field(
        default="quarantine",
        description="What to do with a change at or below the collected-tombstone horizon "
        "for a key with no state: quarantine it (default) or apply it as if new.",
    )
    name: str | None = Field(default=None, description="Flow name; defaults to the target.")
    cluster_by: list[str] | None = Field(
        default=None,
        description="Delta liquid clustering columns the target is created with (the keys, "
        "say): once OPTIMIZE has clustered it, the MERGE of a batch of a few keys (up to "
        "32) reads only the files whose key range holds them.",
    )
    table_properties: dict[str, str] | None = Field(
        default=None, description="Delta table properties the target is created with."
    )
    max_staleness: timedelta | None = Field(
        default=None,
        description="autocdc: how old the applied target may be. Set, a micro-batch is "
        "only staged (appended to the flow's staging table) and the staged changes are "
        "applied as one batch once the oldest is older than this (or max_staged_rows "
        "are staged, or on apply_staged); current() reads the target merged with them.",
    )
    max_staged_rows: int | None = Field(
        default=None,
        description="autocdc: with max_staleness, apply the staged changes once at least "
        "this many rows are staged.",
    )

    @field_validator("max_staleness", mode="before")
    @classmethod
    def _interval(cls, value: object) -> object:
        return None if value is None else parse_interval(value)

    @field_validator("max_staged_rows", mode="before")
    @classmethod
    def _positive_rows(cls, value: object) -> object:
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InvalidMaxStalenessError(
                field="max_staged_rows", value=value, what="a positive integer"
            )
        return value

    @field_validator("stored_as_scd_type", mode="before")
    @classmethod
    def _scd_type_from_str(cls, value: object) -> object:
        return scd_type_from_str(value)

    @field_validator("keys", mode="before")
    @classmethod
    def _key_as_list(cls, value: object) -> object:
        return [value] if isinstance(value, str) else value

    @model_validator(mode="after")
    def _check(self) -> FlowDefinition:
        if not self.keys or any(not k for k in self.keys):
            raise EmptyKeysError()
        if not 0 <= self.tombstone_retention_days <= MAX_RETENTION_DAYS:
            raise InvalidRetentionError(
                value=self.tombstone_retention_days, maximum=MAX_RETENTION_DAYS
            )
        lists = {
            "keys": self.keys,
            "column_list": self.column_list,
            "except_column_list": self.except_column_list,
            "track_history_column_list": self.track_history_column_list,
            "track_history_except_column_list": self.track_history_except_column_list,
        }
        if isinstance(self.sequence_by, list):
            lists["sequence_by"] = self.sequence_by
        if isinstance(self.columns_to_update, list):
            lists["columns_to_update"] = self.columns_to_update
        for field in IGNORE_NULL_LISTS:
            lists[field] = getattr(self, field)
        for field, names in lists.items():
            seen = [n.lower() for n in names or []]
            twice = sorted({n for n in names or [] if seen.count(n.lower()) > 1})
            if twice:
                raise DuplicateColumnError(field=field, columns=twice)
        pairs = [("column_list", "except_column_list"), TRACK_HISTORY_LISTS]
        for first, second in pairs:
            if getattr(self, first) is not None and getattr(self, second) is not None:
                raise ConflictingColumnListsError(first=first, second=second)
        ignoring = ["ignore_null_updates"] if self.ignore_null_updates else []
        ignoring += [f for f in IGNORE_NULL_LISTS if getattr(self, f) is not None]
        if len(ignoring) > 1:
            raise ConflictingIgnoreNullUpdatesError(first=ignoring[0], second=ignoring[1])
        if self.stored_as_scd_type == 2 and self.apply_as_truncates is not None:
            raise TruncateWithScd2Error()
        if self.stored_as_scd_type == 1:
            for field in pairs[1]:
                if getattr(self, field) is not None:
                    raise TrackHistoryWithScd1Error(field=field)
        if self.column_list is not None:
            missing = [k for k in self.keys if k not in self.column_list]
            if missing:
                raise KeyNotSelectedError(columns=missing, field="column_list")
        if self.except_column_list is not None:
            removed = [k for k in self.keys if k in self.except_column_list]
            if removed:
                raise KeyNotSelectedError(columns=removed, field="except_column_list")
        self._check_track_history()
        self._check_partial()
        self._check_groups()
        self._check_staleness()
        if self.snapshot_target:
            self.check_snapshot_target()
        return self

    def check_snapshot_target(self) -> None:
        """A snapshot shares only an SCD type 1 target, and one clock (no groups): checked
        for a flow declared ``snapshot_target``, and by a pipeline for each change flow it
        puts on a snapshot's clock (a running flow is not validated again)."""
        why = None
        if self.stored_as_scd_type == 2:
            why = "SCD type 2 is not supported for a target shared with snapshots"
        elif self.sequence_groups is not None:
            why = "a target with sequence groups takes no snapshot (it takes no truncate)"
        if why is not None:
            raise SnapshotSequenceError(
                flow=self.flow_name,
                target=self.target,
                why=why,
                remedy="Give the snapshot flow a target of its own, or make this one "
                "SCD type 1 without groups.",
            )

    def _check_staleness(self) -> None:
        """Staged batches are applied as one: exact for full-row upserts only."""
        if self.max_staleness is None:
            if self.max_staged_rows is not None:
                raise MaxStalenessUnsupportedError(
                    flow=self.flow_name, why="`max_staged_rows` but no `max_staleness`"
                )
            return
        if self.partial:
            option = next(
                (
                    f
                    for f in (
                        "sequence_groups",
                        "columns_to_update",
                        "ignore_null_updates",
                        *IGNORE_NULL_LISTS,
                    )
                    if getattr(self, f) not in (None, False)
                ),
                "partial_target",
            )
            raise MaxStalenessUnsupportedError(
                flow=self.flow_name, why=f"`{option}` (partial upserts)"
            )

    def _check_groups(self) -> None:
        """Sequence groups: a flow names its own group among the target's, whose columns
        are disjoint value columns; type 1 only, no truncates, an explicit clock."""
        groups, group = self.sequence_groups, self.sequence_group
        if groups is None and group is None:
            return
        why = None
        columns = [c for names in (groups or {}).values() for c in names]
        if groups is None or group is None:
            why = "`sequence_groups` and `sequence_group` go together"
        elif not groups or any(not names for names in groups.values()):
            why = "a group has no columns"
        elif any(not GROUP_NAME.fullmatch(g) for g in groups):
            why = f"group names {sorted(groups)} must be letters, digits and _"
        elif group not in groups:
            why = f"`sequence_group` {group!r} is none of the groups {sorted(groups)}"
        elif len({c.lower() for c in columns}) < len(columns):
            why = "a column is in two groups"
        elif any(c in self.keys for c in columns):
            why = "a key is in a group (keys are every group's)"
        elif self.stored_as_scd_type == 2:
            why = (
                "SCD type 2 orders a key's versions, and nothing orders one group's changes "
                "against another's"
            )
        elif self.apply_as_truncates is not None:
            why = "`apply_as_truncates` is set (a truncate is not supported with groups)"
        elif self.sequence_by is None:
            why = "`sequence_by` is not set (it is the group's clock)"
        elif isinstance(self.columns_to_update, list) and any(
            c not in groups[group] for c in self.columns_to_update
        ):
            why = f"`columns_to_update` names columns outside group {group!r}"
        if why is not None:
            raise SequenceGroupsError(flow=self.flow_name, why=why)

    @property
    def group_columns(self) -> list[str] | None:
        """The value columns of this flow's sequence group (None: no groups)."""
        if self.sequence_groups is None or self.sequence_group is None:
            return None
        return list(self.sequence_groups[self.sequence_group])

    def _check_partial(self) -> None:
        """Columns an upsert may leave unset must be columns the target takes."""
        fields = [*IGNORE_NULL_LISTS]
        if isinstance(self.columns_to_update, list):
            fields.append("columns_to_update")
        for field in fields:
            excluded = [
                c
                for c in getattr(self, field) or []
                if c not in self.keys and not self._selected(c)
            ]
            if excluded:
                raise ColumnNotSelectedError(field=field, columns=excluded)

    def _selected(self, column: str) -> bool:
        """Whether ``column_list`` / ``except_column_list`` let ``column`` into the target."""
        if self.column_list is not None:
            return column in self.column_list
        return column not in (self.except_column_list or [])

    def _check_track_history(self) -> None:
        """A track-history list may name only selected, non-key columns."""
        for field in TRACK_HISTORY_LISTS:
            names = getattr(self, field) or []
            keys = [c for c in names if c in self.keys]
            if keys:
                raise TrackHistoryColumnNotSelectedError(
                    field=field, columns=keys, why="are keys (a key never changes in a version)"
                )
            excluded = [
                c
                for c in names
                if c in (self.except_column_list or [])
                or (self.column_list is not None and c not in self.column_list)
            ]
            if excluded:
                raise TrackHistoryColumnNotSelectedError(
                    field=field, columns=excluded, why="are not in the target"
                )

    @property
    def flow_name(self) -> str:
        return self.name or self.target

    def shared(self) -> dict[str, object]:
        """What the flows into one target share through its state table, which each of
        them must declare alike (the source, sequence, delete condition and column
        selection are each flow's own); for SCD type 2, which columns open a version (the
        history is recomputed by whichever flow runs)."""
        return {
            "keys": self.keys,
            "stored_as_scd_type": self.stored_as_scd_type,
            "track_history_column_list": self.track_history_column_list,
            "track_history_except_column_list": self.track_history_except_column_list,
            "sequence_groups": self.sequence_groups,
        }

    @property
    def is_auto(self) -> bool:
        """No ``sequence_by``: the feed's own change columns drive the flow (the auto mode
        of :mod:`autocdc.engine.change_rows`)."""
        return self.sequence_by is None

    def reads_change_type(self, columns: Collection[str]) -> bool:
        """Whether the rows' operations come from the feed's ``_CHANGE_TYPE`` (explicit
        options win)."""
        return (
            self.is_auto
            and self.apply_as_deletes is None
            and self.apply_as_truncates is None
            and change_rows.CHANGE_TYPE in columns
        )

    @property
    def pseudo_columns(self) -> tuple[str, ...]:
        """Columns that drive the flow and are stored only when ``column_list`` names them."""
        return change_rows.PSEUDO_COLUMNS if self.is_auto else ()

    @property
    def sets_columns(self) -> bool:
        """Whether an upsert of this flow may leave columns unset (a partial upsert)."""
        return (
            self.columns_to_update is not None
            or self.sequence_group is not None
            or self.ignore_null_updates
            or any(getattr(self, f) is not None for f in IGNORE_NULL_LISTS)
        )

    @property
    def partial(self) -> bool:
        """Whether the flow declares its target partial (its state records which columns
        each upsert set): see docs/semantics.md, partial upserts."""
        return self.partial_target or self.sets_columns or self.sequence_groups is not None

    @property
    def columns_to_update_column(self) -> str | None:
        """The feed's column that lists, per row, the columns it sets (never stored)."""
        return self.columns_to_update if isinstance(self.columns_to_update, str) else None

    def ignores_null(self, column: str) -> bool:
        """Whether a NULL in ``column`` means "not set" rather than "set to NULL"."""
        if self.ignore_null_updates_column_list is not None:
            return column in self.ignore_null_updates_column_list
        if self.ignore_null_updates_except_column_list is not None:
            return column not in self.ignore_null_updates_except_column_list
        return self.ignore_null_updates

    def sets(self, column: str, present: bool) -> Column:
        """Whether an upsert sets value column ``column``: the flow's feed carries it
        (``present``), ``columns_to_update`` names it, and it is not a NULL that the
        ignore-null options read as "not set". Only for a partial target."""
        if not present:
            return F.lit(False)
        if isinstance(self.columns_to_update, list) and column not in self.columns_to_update:
            return F.lit(False)
        listed = F.lit(True)
        if self.columns_to_update_column is not None:
            named = F.col(ident(self.columns_to_update_column))
            listed = named.isNull() | F.coalesce(
                F.array_contains(named, F.lit(column)), F.lit(False)
            )
        if self.ignores_null(column):
            listed = listed & F.col(ident(column)).isNotNull()
        return listed

    def sequence_column(self) -> Column:
        """The sequence as one orderable value (a struct for a list of columns, or for
        ``_CHANGE_SEQUENCE_NUMBER`` when there is no ``sequence_by``), on the clock shared
        with snapshots when ``snapshot_target``."""
        if self.sequence_by is None:
            declared = change_rows.sequence()
        elif isinstance(self.sequence_by, list):
            declared = F.struct(*[F.col(ident(c)) for c in self.sequence_by])
        else:
            declared = to_column(self.sequence_by)
        return clock.tiered(declared, clock.CHANGE) if self.snapshot_target else declared

    def resolve(
        self,
        schema: StructType,
        sequence_type: DataType,
        stored: list[str] | None = None,
        never_stored: Collection[str] = (),
    ) -> ResolvedColumns:
        """Check the spec against a change feed's schema and sequence type.

        ``stored``: the target's columns when it exists; a later batch may leave them out.
        ``never_stored``: columns no target keeps whatever the lists say (Spark's
        corrupt-record column: it only ever holds the raw text of a quarantined row; a
        source's no-change mark, a reserved name the engine expects).
        """
        columns = schema.names
        reserved = [c for c in columns if is_reserved(c) and c not in never_stored]
        if reserved:
            raise ReservedColumnError(columns=reserved)
        if not is_orderable_sequence(sequence_type):
            raise InvalidSequenceTypeError(type=sequence_type.simpleString())
        known = [*columns, *[c for c in stored or [] if c not in columns]]
        named = {
            "keys": (self.keys, columns),
            "column_list": (self.column_list, known),
            "except_column_list": (self.except_column_list, known),
            "track_history_column_list": (self.track_history_column_list, known),
            "track_history_except_column_list": (self.track_history_except_column_list, known),
        }
        if isinstance(self.sequence_by, list):
            named["sequence_by"] = (self.sequence_by, columns)
        for field in IGNORE_NULL_LISTS:
            named[field] = (getattr(self, field), known)
        if self.columns_to_update is not None:
            listed = self.columns_to_update_column
            named["columns_to_update"] = (
                [listed] if listed is not None else self.columns_to_update,
                columns if listed is not None else known,
            )
        for field, (names, available) in named.items():
            unknown = [c for c in names or [] if c not in available]
            if unknown:
                raise UnknownColumnError(field=field, columns=unknown, available=available)
        types = {f.name: f.dataType for f in schema.fields}
        for key in self.keys:
            if is_unreliable_key(types[key]):
                raise InvalidKeyTypeError(column=key, type=types[key].simpleString())
        excluded = set(never_stored)
        listing = self.columns_to_update_column
        if listing is not None:
            found = types[listing]
            if not (isinstance(found, ArrayType) and isinstance(found.elementType, StringType)):
                raise InvalidColumnsToUpdateError(column=listing, type=found.simpleString())
            excluded.add(listing)
        if self.column_list is not None:
            payload = [c for c in self.column_list if c not in excluded]
        else:
            excluded |= {*(self.except_column_list or []), *self.pseudo_columns}
            payload = [c for c in columns if c not in excluded]
        own = self.group_columns
        if own is not None:  # a flow sets its own group's columns, and takes no other
            payload = [c for c in payload if c in self.keys or c in own]
        if self.track_history_column_list is not None:
            tracked = [c for c in payload if c in self.track_history_column_list]
        else:
            untracked = set(self.track_history_except_column_list or [])
            tracked = [c for c in payload if c not in untracked]
        return ResolvedColumns(keys=list(self.keys), payload=payload, tracked=tracked)


class Running:
    """A declared flow, running: it holds its frozen definition and reads the definition's
    fields and properties as its own (``flow.target``); writing one is refused as the
    definition refuses it. What a run learns of its tables lives beside the definition,
    never in it."""

    definition: BaseModel

    def __getattr__(self, name: str) -> Any:
        definition = self.__dict__.get("definition")
        if definition is None or name.startswith("_"):
            raise AttributeError(name)
        return getattr(definition, name)

    def __setattr__(self, name: str, value: Any) -> None:
        definition = self.__dict__.get("definition")
        if definition is not None and name in type(definition).model_fields:
            setattr(definition, name, value)  # frozen: pydantic refuses it
            return
        super().__setattr__(name, value)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.definition!r})"
