"""Incremental extraction from a database table, without a change log: what a run reads.

An extraction source queries one table (PostgreSQL through libpq, or any database through
JDBC) with one of three strategies:

- ``WATERMARK``: autocdc keeps the checkpoint. ``cdc_order`` names columns, each ascending
  (the default) or descending; a row counts as changed when it has advanced past the
  checkpoint in any of them, a predicate pushed into the query. The first run reads
  everything in scope.
- ``CUSTOM``: the user's cursor, an object with four hooks (:class:`Cursor`), builds the
  batches from the checkpoint and folds what they read into the next one.
- ``STATELESS``: no checkpoint; every run reads everything in scope (with a snapshot
  flow, rows gone from the table become deletes).

Every strategy is a cursor: WATERMARK's is :class:`Watermark`, STATELESS's
:class:`Stateless`. This module is pure (no Spark, no database): the declaration, the
run's batches planned from the stored checkpoint (:func:`plan`), the next checkpoint
folded from what they read (:func:`advance`), and the options (:func:`resolve_options`).
Reading is :mod:`autocdc.sources.pgextract` (``dsn``, in the driver) or
:mod:`autocdc.sources.jdbcextract` (``url``, on the executors); the run around it (lease,
retries, staging, apply, then the checkpoint) is :mod:`autocdc.pipelines.execute.extraction`.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from decimal import Decimal
from enum import Enum
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from autocdc.sources.errors import (
    BadBatchError,
    CheckpointNotJsonError,
    CursorHookMissingError,
    NoCdcOrderError,
    SourceOptionError,
)
from autocdc.sources.postgres import qualified

HOOKS = ("batches", "seed", "fold", "merge")
MIN_RETRIES, MAX_RETRIES = 1, 5
_ORDER = re.compile(r"^\s*(.+?)(?:\s+(asc|desc))?\s*$", re.IGNORECASE | re.DOTALL)
_UNITS = {"microsecond": 1e-6, "millisecond": 1e-3, "second": 1, "minute": 60, "hour": 3600}
_UNITS |= {"day": 86_400, "week": 7 * 86_400}
_SPAN = re.compile(rf"\s*(\d+(?:\.\d+)?)\s*({'|'.join(_UNITS)})s?\s*", re.IGNORECASE)
LOOKBACK_FIX = (
    "Give an interval for a timestamp or date column ('30 seconds', '1 hour 30 minutes'), "
    "a number for a numeric one."
)


class Strategy(str, Enum):
    WATERMARK = "WATERMARK"
    CUSTOM = "CUSTOM"
    STATELESS = "STATELESS"


def ident(name: str) -> str:
    """A column name quoted for PostgreSQL."""
    return '"' + name.replace('"', '""') + '"'


def option_error(source: str, option: str, problem: str, fix: str) -> SourceOptionError:
    """The error for option ``option`` of extraction source ``source``."""
    return SourceOptionError(
        option=option, source=f"extraction `{source}`", problem=problem, fix=fix
    )


@dataclass(frozen=True)
class Batch:
    """One query of a run: the rows of the source's table that match ``where``, a SQL
    predicate with ``%s`` placeholders for ``params`` (and ``%%`` for a literal ``%``),
    as psycopg takes them. Its filter encodes the cursor, e.g.
    ``Batch("region = %s AND updated_at >= %s", ("eu", "2024-05-01 10:00:00+00"))``."""

    where: str = "TRUE"
    params: tuple[Any, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "params", tuple(self.params))

    def serialized(self) -> str:
        """What two batches must share to be one read (a parameter that is no JSON value,
        a datetime say, by its repr)."""
        return json.dumps([self.where, list(self.params)], default=repr)

    def narrowed(self, predicate: str | None) -> Batch:
        """This batch, also matching ``predicate`` (plain SQL, no placeholders)."""
        if predicate is None:
            return self
        predicate = predicate.replace("%", "%%")
        if self.where == "TRUE":
            return Batch(predicate, self.params)
        return Batch(f"({self.where}) AND ({predicate})", self.params)

    def within(self, other: Batch) -> Batch:
        """The rows matching both this batch and ``other`` (its placeholders after ours)."""
        if self.where == "TRUE":
            return other
        return Batch(f"({self.where}) AND ({other.where})", self.params + other.params)


class Cursor(Protocol):
    """A CUSTOM source's four hooks. ``checkpoint`` is None on the first run, else what the
    last successful run stored. Every batch of a run folds its rows into its own
    ``seed(checkpoint)``; the batches' accumulators are then merged into the next
    checkpoint, so ``merge`` must be associative and commutative (and merging an
    accumulator with one that saw fewer rows must keep what it saw, as a maximum does).
    Accumulators are JSON values (and Decimal); ``fold`` may change ``acc`` in place.
    Batches are read in threads: the hooks of one cursor run at once, so what a batch
    learns belongs in its accumulator, never on the cursor. A ``url`` source folds each
    partition of the staged read (not each batch) into its own seed, in a copy of the
    cursor on an executor, then merges those accumulators."""

    def batches(self, checkpoint: Any) -> Iterable[Batch | str]: ...

    def seed(self, checkpoint: Any) -> Any: ...

    def fold(self, acc: Any, row: Mapping[str, Any]) -> Any: ...

    def merge(self, a: Any, b: Any) -> Any: ...


@dataclass(frozen=True)
class Order:
    """One ``cdc_order`` column and its direction."""

    column: str
    descending: bool = False

    @classmethod
    def parse(cls, text: str, source: str) -> Order:
        """``"updated_at"``, ``"updated_at ASC"``, ``"version DESC"``."""
        match = _ORDER.match(text) if isinstance(text, str) else None
        if match is None:
            raise option_error(
                source=source,
                option="cdc_order",
                problem=f"has the entry {text!r}",
                fix="Give column names, each optionally followed by ASC or DESC, e.g. "
                "['updated_at', 'version DESC'].",
            )
        column = match[1].strip()
        if len(column) > 1 and column[0] == column[-1] == '"':
            column = column[1:-1].replace('""', '"')
        return cls(column, (match[2] or "asc").lower() == "desc")

    def __str__(self) -> str:
        return f"{self.column} {'DESC' if self.descending else 'ASC'}"

    def further(self, a: Any, b: Any) -> Any:
        """The value further along this direction; a NULL is not along it at all."""
        if a is None or b is None:
            return b if a is None else a
        return (min if self.descending else max)(a, b)


@dataclass(frozen=True)
class Watermark:
    """WATERMARK as a cursor. The checkpoint maps each ``cdc_order`` column to the greatest
    value read (ascending) or the least (descending), None while none was read.

    The predicate is ``c >= checkpoint`` (``<=`` descending), not ``>``: a row written
    after a run with the value the checkpoint holds (a coarse clock, two transactions in
    one tick) is read by the next run instead of skipped; the rows read again are changes
    the target already holds, which the engine absorbs (docs/semantics.md). Values compare
    in Python as the rows give them (numbers as numbers, timestamps as their ISO text in
    UTC, which sorts as time); where the database's order differs (a text column's
    collation), the checkpoint is one of the values read, so it can only make a run read
    more, never skip a row.

    ``lookback`` moves the predicate that far behind the checkpoint (never the checkpoint
    itself): a row committed after a later one was read, with a value below the
    checkpoint, is read by the next run as long as it lies within the lookback.
    """

    order: tuple[Order, ...]
    lookback: timedelta | int | Decimal | None = None
    source: str = "?"

    def batches(self, checkpoint: Any) -> list[Batch]:
        if checkpoint is None:
            return [Batch()]
        terms, params = [], []
        for o in self.order:
            value = checkpoint.get(o.column)
            if value is None:
                terms.append(f"{ident(o.column)} IS NOT NULL")
            else:
                terms.append(f"{ident(o.column)} {'<=' if o.descending else '>='} %s")
                params.append(self.looked_back(o, value))
        return [Batch(" OR ".join(terms), tuple(params))]

    def looked_back(self, o: Order, value: Any) -> Any:
        """``value`` moved back by the lookback along ``o``'s direction."""
        if self.lookback is None:
            return value
        sign = 1 if o.descending else -1
        numeric = isinstance(self.lookback, int | Decimal)
        if numeric and isinstance(value, int | Decimal) and not isinstance(value, bool):
            return value + sign * self.lookback
        if not numeric and isinstance(value, str):
            try:
                at = datetime.fromisoformat(value)
            except ValueError:
                at = None
            if at is not None and len(value) > len("2024-05-01"):
                return (at + sign * self.lookback).isoformat(sep=" ")
            if at is not None:  # a date: whole days, at least the lookback
                days = -(-self.lookback // timedelta(days=1))
                return (date.fromisoformat(value) + sign * timedelta(days=days)).isoformat()
        raise option_error(
            source=self.source,
            option="lookback",
            problem=f"is {self.lookback!s} but column {o.column!r} holds {value!r}",
            fix=LOOKBACK_FIX,
        )

    def seed(self, checkpoint: Any) -> dict[str, Any]:
        return {o.column: (checkpoint or {}).get(o.column) for o in self.order}

    def fold(self, acc: dict[str, Any], row: Mapping[str, Any]) -> dict[str, Any]:
        for o in self.order:
            acc[o.column] = o.further(acc[o.column], row.get(o.column))
        return acc

    def merge(self, a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
        return {o.column: o.further(a[o.column], b[o.column]) for o in self.order}


@dataclass(frozen=True)
class Limit:
    """WATERMARK's ``limit``: a run reads up to ``rows`` rows past the checkpoint, in the
    column's order, and every row tied at the edge it stops at (its checkpoint), which the
    next run reads again with the rows past it. The edge is looked up before the read
    (:meth:`beyond`), among the rows strictly past the checkpoint, so each run moves on
    even when more rows than ``rows`` share one value."""

    order: Order
    rows: int

    def beyond(self, checkpoint: Any) -> Batch:
        """The rows the edge is looked for among: past the checkpoint, not NULL."""
        column = ident(self.order.column)
        value = (checkpoint or {}).get(self.order.column)
        if value is None:
            return Batch(f"{column} IS NOT NULL")
        return Batch(f"{column} {'<' if self.order.descending else '>'} %s", (value,))

    def within(self, checkpoint: Any, edge: Any) -> Batch | None:
        """The run's bound: up to ``edge`` (the ``rows``-th value past the checkpoint, None
        when none is). The first run also reads the rows whose value is NULL, which no
        later run reads; with nothing past the checkpoint, a run reads up to it."""
        column = ident(self.order.column)
        value = (checkpoint or {}).get(self.order.column)
        if edge is None and value is None:
            return None
        bound = f"{column} {'>=' if self.order.descending else '<='} %s"
        if value is None:
            return Batch(f"{column} IS NULL OR {bound}", (edge,))
        return Batch(bound, (value if edge is None else edge,))


class Stateless:
    """STATELESS as a cursor: one batch, the whole table in scope, no checkpoint."""

    def batches(self, checkpoint: Any) -> list[Batch]:
        return [Batch()]

    def seed(self, checkpoint: Any) -> None:
        return None

    def fold(self, acc: Any, row: Mapping[str, Any]) -> None:
        return None

    def merge(self, a: Any, b: Any) -> None:
        return None


class ExtractionOptions(BaseModel):
    """How a run reads a source. Given on the source (its defaults), the flow or the run;
    see :func:`resolve_options`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_concurrency: int | None = Field(
        default=None,
        description="Queries at once: a `dsn` source's batches, in threads (default 1); a "
        "`url` source's partitions, on the executors (default: all, as cores allow).",
    )
    retries: int = Field(
        default=1,
        description="Times a failed batch is read again, clamped to 1..5: a run always "
        "retries once, and never hammers a failing database.",
    )
    staging: bool = Field(
        default=False,
        description="Each batch writes what it read to Parquet files under the flow's "
        "checkpoint folder (not the driver's memory); the load reads them, and they are "
        "swept when the run ends.",
    )
    page_rows: int = Field(
        default=10_000, description="Rows fetched per round trip (and per staged row group)."
    )

    @field_validator("retries")
    @classmethod
    def _clamp(cls, value: int) -> int:
        return min(max(value, MIN_RETRIES), MAX_RETRIES)

    @model_validator(mode="after")
    def _check(self) -> ExtractionOptions:
        for option in ("max_concurrency", "page_rows"):
            if getattr(self, option) is not None and getattr(self, option) < 1:
                raise SourceOptionError(
                    option=option,
                    source="extraction",
                    problem=f"is {getattr(self, option)}",
                    fix="Give a number of at least 1.",
                )
        return self


def resolve_options(*levels: ExtractionOptions | None) -> ExtractionOptions:
    """The options of a run: the first set of ``levels`` (the run's, the flow's, the
    source's), whole. A set replaces the ones below it entirely: what it leaves out takes
    the defaults, never a lower level's value, so the options a run reads with are the
    ones written in one place."""
    return next((o for o in levels if o is not None), ExtractionOptions())


class Extraction(BaseModel):
    """A source that queries a table; flows name it as their ``source``.

    >>> Extraction(name="orders_src", dsn="dbname=shop", table="orders",
    ...            cdc_order=["updated_at"]).definition()["cdc_order"]
    ['updated_at ASC']
    """

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)

    name: str = Field(min_length=1)
    dsn: str | None = Field(
        default=None, min_length=1, repr=False, description="PostgreSQL: a libpq string."
    )
    url: str | None = Field(
        default=None,
        min_length=1,
        repr=False,
        description="Any database: a JDBC URL (`jdbc:mariadb://host/db`), read by Spark.",
    )
    table: str = Field(
        min_length=1,
        description="`schema.table`, or `table` (in public for a `dsn`, the URL's database "
        "for a `url`).",
    )
    user: str | None = Field(default=None, description="`url`: the database user.")
    password_env: str | None = Field(
        default=None, description="`url`: the environment variable holding the password."
    )
    password_file: str | None = Field(
        default=None, description="`url`: a file holding the password (its first line)."
    )
    properties: dict[str, str] = Field(
        default_factory=dict,
        repr=False,
        description="`url`: more JDBC connection properties (the driver's own options).",
    )
    partition_column: str | None = Field(
        default=None,
        description="`url`: a numeric column each batch is split on, into `num_partitions` "
        "ranges between its least and greatest value in the batch, read in parallel.",
    )
    num_partitions: int = Field(default=1, description="`url`: reads per batch.")
    strategy: Strategy = Strategy.WATERMARK
    cdc_order: tuple[Order, ...] = ()
    cursor: Any = Field(default=None, description="CUSTOM: an object (or class) with hooks.")
    where: str | None = Field(default=None, description="SQL predicate: the rows in scope.")
    partitions: tuple[str, ...] = Field(
        default=(),
        description="SQL predicates, one batch each (together they must cover the scope).",
    )
    columns: str | None = Field(
        default=None,
        description="Spark DDL of the columns to keep, typed (default: every column, typed "
        "as the table implies).",
    )
    lookback: timedelta | int | Decimal | None = Field(
        default=None,
        description="WATERMARK: how far behind its checkpoint each run reads again: an "
        "interval ('30 seconds') for a timestamp or date column, a number for a numeric one.",
    )
    limit: int | None = Field(
        default=None,
        description="WATERMARK with one cdc_order column: rows a run reads past its "
        "checkpoint, in that column's order (with the rows tied at the edge).",
    )
    options: ExtractionOptions | None = None

    @model_validator(mode="before")
    @classmethod
    def _parse(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        if str(data.get("dsn") or "").startswith("jdbc:") and data.get("url") is None:
            data["url"] = data.pop("dsn")  # a JDBC URL where a libpq string may be
        source = str(data.get("name"))
        strategy = data.get("strategy", Strategy.WATERMARK)
        try:
            data["strategy"] = Strategy(str(getattr(strategy, "value", strategy)).upper())
        except ValueError:
            raise option_error(
                source=source,
                option="strategy",
                problem=f"is {strategy!r}",
                fix="Use WATERMARK, CUSTOM or STATELESS.",
            ) from None
        order = data.get("cdc_order") or ()
        if isinstance(order, str):
            order = [order]
        data["cdc_order"] = tuple(
            o if isinstance(o, Order) else Order.parse(o, source) for o in order
        )
        if isinstance(data.get("cursor"), type):
            data["cursor"] = data["cursor"]()
        if isinstance(data.get("partitions"), str):
            data["partitions"] = [data["partitions"]]
        if data.get("lookback") is not None:
            data["lookback"] = _lookback(data["lookback"], source)
        return data

    @model_validator(mode="after")
    def _check(self) -> Extraction:
        if (self.dsn is None) == (self.url is None):
            raise option_error(
                source=self.name,
                option="dsn" if self.dsn is not None else "url",
                problem="is given with `url`" if self.dsn is not None else "is missing",
                fix="Give one connection: `dsn` (a libpq string: PostgreSQL read in the "
                "driver) or `url` (a JDBC URL: any database, read by Spark's executors).",
            )
        if self.url is not None and not self.url.startswith("jdbc:"):
            raise option_error(
                source=self.name,
                option="url",
                problem="does not start with `jdbc:`",
                fix="Give a JDBC URL, e.g. jdbc:mariadb://host:3306/shop, "
                "jdbc:postgresql://host/shop or jdbc:sqlite:/path/shop.db.",
            )
        jdbc_only = ("user", "password_env", "password_file", "partition_column", "properties")
        for option in jdbc_only if self.url is None else ():
            if getattr(self, option):
                raise option_error(
                    source=self.name,
                    option=option,
                    problem="is set for a `dsn` source",
                    fix="It configures a JDBC read: give `url` instead of `dsn`, or put the "
                    "setting in the libpq string.",
                )
        if self.num_partitions < 1 or (self.num_partitions > 1) != bool(self.partition_column):
            raise option_error(
                source=self.name,
                option="num_partitions",
                problem=f"is {self.num_partitions} with partition_column {self.partition_column!r}",
                fix="Give both, num_partitions of at least 2 with a numeric partition_column, "
                "or neither.",
            )
        if self.strategy is Strategy.WATERMARK and not self.cdc_order:
            raise NoCdcOrderError(source=self.name)
        if self.strategy is not Strategy.WATERMARK and self.cdc_order:
            raise option_error(
                source=self.name,
                option="cdc_order",
                problem=f"is set for a {self.strategy.value} source",
                fix="It orders a WATERMARK source's rows: remove it, or use WATERMARK.",
            )
        if self.strategy is Strategy.CUSTOM:
            missing = [h for h in HOOKS if not callable(getattr(self.cursor, h, None))]
            if missing:
                kind = "none given" if self.cursor is None else type(self.cursor).__qualname__
                raise CursorHookMissingError(source=self.name, cursor=kind, missing=missing)
        elif self.cursor is not None:
            raise option_error(
                source=self.name,
                option="cursor",
                problem=f"is set for a {self.strategy.value} source",
                fix="A cursor drives a CUSTOM source: remove it, or use strategy CUSTOM.",
            )
        for option in ("lookback", "limit"):
            if getattr(self, option) is not None and self.strategy is not Strategy.WATERMARK:
                raise option_error(
                    source=self.name,
                    option=option,
                    problem=f"is set for a {self.strategy.value} source",
                    fix="It moves a WATERMARK source's checkpoint: remove it, or use WATERMARK.",
                )
        if self.limit is not None and (self.limit < 1 or len(self.cdc_order) != 1):
            raise option_error(
                source=self.name,
                option="limit",
                problem=f"is {self.limit} with cdc_order {[str(o) for o in self.cdc_order]}",
                fix="Give a number of rows of at least 1, with exactly one cdc_order column "
                "(the order rows are read in).",
            )
        return self

    @property
    def keeps_checkpoint(self) -> bool:
        return self.strategy is not Strategy.STATELESS

    def run_cursor(self) -> Cursor:
        if self.strategy is Strategy.WATERMARK:
            return Watermark(self.cdc_order, self.lookback, self.name)
        if self.strategy is Strategy.CUSTOM:
            return self.cursor
        return Stateless()

    def run_limit(self) -> Limit | None:
        return None if self.limit is None else Limit(self.cdc_order[0], self.limit)

    def definition(self) -> dict[str, Any]:
        """What a stored checkpoint depends on: another value makes it meaningless."""
        table = qualified(self.table) if self.dsn is not None else self.table
        found: dict[str, Any] = {"strategy": self.strategy.value, "table": table}
        if self.cdc_order:
            found["cdc_order"] = [str(o) for o in self.cdc_order]
        if self.cursor is not None:
            found["cursor"] = f"{type(self.cursor).__module__}.{type(self.cursor).__qualname__}"
        if self.where is not None:
            found["where"] = self.where
        return found


def _lookback(value: Any, source: str) -> timedelta | int | Decimal:
    """A lookback as :class:`Watermark` applies it: text is an interval, a float exact."""
    if isinstance(value, str):
        spans = _SPAN.findall(value)
        if spans and _SPAN.sub("", value) == "":
            return sum(
                (timedelta(seconds=float(n) * _UNITS[u.lower()]) for n, u in spans),
                timedelta(),
            )
    elif isinstance(value, float) and value >= 0:
        return Decimal(str(value))
    elif (
        isinstance(value, timedelta | int | Decimal)
        and not isinstance(value, bool)
        and value >= type(value)(0)
    ):
        return value
    raise option_error(source=source, option="lookback", problem=f"is {value!r}", fix=LOOKBACK_FIX)


def plan(
    source: Extraction, cursor: Cursor, checkpoint: Any, bound: Batch | None = None
) -> list[Batch]:
    """The run's batches: the cursor's from ``checkpoint``, each narrowed to the source's
    scope and ``bound`` (a limit's, :meth:`Limit.within`) and split by its partitions
    (each keeping the cursor's predicate). Batches with one serialized form are read once,
    in the order first planned."""
    planned: dict[str, Batch] = {}
    for found in cursor.batches(checkpoint):
        if isinstance(found, str):
            found = Batch(found)
        if not isinstance(found, Batch):
            raise BadBatchError(source=source.name, value=repr(found))
        if bound is not None:
            found = found.within(bound)
        for part in source.partitions or (None,):
            batch = found.narrowed(source.where).narrowed(part)
            planned.setdefault(batch.serialized(), batch)
    return list(planned.values())


def advance(cursor: Cursor, accumulators: list[Any]) -> Any:
    """The next checkpoint: the batches' accumulators merged, in plan order (never in the
    order the batches completed)."""
    return functools.reduce(cursor.merge, accumulators)


def _gap(o: Order, held: Any, newest: Any) -> float | None:
    """How far ``held`` is behind ``newest`` along ``o``: seconds for timestamps and dates,
    the difference for numbers, never below 0; None where it cannot tell (a NULL, text)."""
    if held is None or newest is None:
        return None
    if isinstance(held, int | Decimal) and isinstance(newest, int | Decimal):
        gap = float(held - newest if o.descending else newest - held)
    else:
        try:
            span = datetime.fromisoformat(newest) - datetime.fromisoformat(held)
        except (TypeError, ValueError):
            return None
        gap = (-span if o.descending else span).total_seconds()
    return max(gap, 0.0)  # rows written during the run: read, so not behind


def behind(order: tuple[Order, ...], checkpoint: Any, newest: Mapping[str, Any]) -> dict:
    """Per ``cdc_order`` column, how far the checkpoint is behind the newest value the
    table holds (``autocdc status``'s lag of an extraction flow)."""
    held = checkpoint or {}
    return {o.column: _gap(o, held.get(o.column), newest.get(o.column)) for o in order}


def dumps(value: Any, source: str = "?") -> str:
    """JSON text of a checkpoint or batch; a Decimal is kept exact (``{"$decimal": ...}``)."""

    def encode(item: Any) -> Any:
        if isinstance(item, Decimal):
            return {"$decimal": str(item)}
        raise CheckpointNotJsonError(
            source=source, problem=f"{item!r} ({type(item).__name__}) is not a JSON value"
        )

    try:
        return json.dumps(value, default=encode, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as error:  # non-string keys, NaN
        raise CheckpointNotJsonError(source=source, problem=str(error)) from None


def loads(text: str) -> Any:
    """What :func:`dumps` wrote."""

    def decode(item: dict) -> Any:
        return Decimal(item["$decimal"]) if item.keys() == {"$decimal"} else item

    return json.loads(text, object_hook=decode)
