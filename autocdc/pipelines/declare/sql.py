"""Parser for Spark Declarative Pipelines SQL definition files.

Only the statement structure is parsed; queries and expressions stay raw source slices
because Spark parses them, so we never disagree with Spark about their meaning. An LALR
grammar with a contextual lexer makes keywords reserved only where a keyword may follow:
`keys` is a fine column name inside a query, but `SEQUENCE BY ts COLUMNS a` ends the
expression at COLUMNS.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Literal, NamedTuple

from lark import Lark, Token, Transformer, v_args
from lark.exceptions import UnexpectedCharacters, UnexpectedInput, UnexpectedToken, VisitError
from lark.tree import Meta

from autocdc.pipelines.errors import PipelineError

_QUOTED_IDENT = r"`(?:[^`]|``)*`"
_STRING = r"""'(?:[^'\\]|\\[\s\S]|'')*'|"(?:[^"\\]|\\[\s\S]|"")*\""""
# A raw span's tokens are shifted in rules of its own (left-recursive, not EBNF `*`, whose
# helper rules lark shares between identical expressions): LALR would otherwise merge the
# states after a query's and an expression's last token, and the contextual lexer would
# then end a query at a word like SEQUENCE. "." "," "=" "*" cannot start a span.
_HEAD = 'IDENT | QUOTED_IDENT | STRING | NUMBER | OP | "(" _inner? ")"'
_ITEM = _HEAD + ' | "." | "," | "=" | "*"'
_GRAMMAR = rf"""
start: _stmt? (";" _stmt?)*
_stmt: streaming_table | materialized_view | temporary_view | insert_flow | cdc_flow
    | snapshot_flow | extraction_source | debezium_source | set_conf

streaming_table: "CREATE"i _refresh? "STREAMING"i "TABLE"i name schema? _clause* ("AS"i query)?
materialized_view: "CREATE"i _refresh? "MATERIALIZED"i "VIEW"i name schema? _clause* "AS"i query
temporary_view: "CREATE"i _replace? "TEMPORARY"i "VIEW"i name comment? "AS"i query
insert_flow: _create_flow "INSERT"i "INTO"i target ("BY"i "NAME"i)? query
cdc_flow: _create_flow? _cdc_into name "FROM"i source keys _cdc_clause*
snapshot_flow: _create_flow? _cdc_into name "FROM"i snapshot keys _snapshot_clause*
set_conf: "SET"i set_key "=" query
extraction_source: "CREATE"i "EXTRACTION"i "SOURCE"i name "FROM"i name _extract_clause*
debezium_source: "CREATE"i "DEBEZIUM"i "SOURCE"i name _debezium_clause*
_refresh: "OR"i "REFRESH"i
_replace: "OR"i ("REFRESH"i | "REPLACE"i)
_create_flow: "CREATE"i "FLOW"i name comment? "AS"i
_cdc_into: ("AUTO"i "CDC"i | "APPLY"i "CHANGES"i) once? "INTO"i
once: "ONCE"i

schema: "(" _inner ")"
_clause: comment | partition_cols | cluster_by | properties | format
comment: "COMMENT"i STRING
partition_cols: "PARTITIONED"i "BY"i "(" _columns ")"
cluster_by: "CLUSTER"i "BY"i "(" _columns ")"
properties: "TBLPROPERTIES"i "(" prop ("," prop)* ")"
prop: (STRING | name) "="? (STRING | NUMBER | IDENT)
format: "USING"i IDENT

source: STREAM "(" name ")" | STREAM? name
snapshot: "SNAPSHOT"i name
keys: "KEYS"i "(" _columns ")"
_cdc_clause: ignore_null_updates | apply_as_deletes | apply_as_truncates | apply_as_upserts
    | sequence_by
    | columns | stored_as_scd_type | track_history | columns_to_update | sequence_group
    | max_staleness | max_staged_rows
_snapshot_clause: stored_as_scd_type | track_history | sequence_by
ignore_null_updates: "IGNORE"i "NULL"i "UPDATES"i ("ON"i _selection)?
apply_as_deletes: "APPLY"i "AS"i "DELETE"i "WHEN"i expr
apply_as_truncates: "APPLY"i "AS"i "TRUNCATE"i "WHEN"i expr
apply_as_upserts: "APPLY"i "AS"i "UPSERT"i "WHEN"i expr
sequence_by: "SEQUENCE"i "BY"i expr
// the flow's sequence group, IN the target's groups: each a name and its columns
sequence_group: "SEQUENCE"i "GROUP"i column "IN"i "(" group_def ("," group_def)* ")"
group_def: column "(" _columns ")"
columns: "COLUMNS"i _selection
// a column of the feed listing, per row, the columns it sets; or (a, b): those columns
columns_to_update: "COLUMNS"i "TO"i "UPDATE"i (column | "(" column_list ")")
track_history: "TRACK"i "HISTORY"i "ON"i _selection
_selection: column_list | "(" column_list ")" | "*" ("EXCEPT"i "(" except_list ")")?
column_list: _columns
except_list: _columns
stored_as_scd_type: "STORED"i "AS"i "SCD"i "TYPE"i NUMBER
// stage micro-batches, apply them once the oldest is older than this (BigQuery's option)
max_staleness: "MAX"i "STALENESS"i "="? (STRING | "INTERVAL"i (STRING | _amounts))
_amounts: amount+
amount: NUMBER IDENT
max_staged_rows: "MAX"i "STAGED"i "ROWS"i "="? NUMBER
// an extraction source's clauses: CONNECTION, STRATEGY, ORDER BY (its cdc_order), WHERE
// (its scope, sent to the database), PARTITIONS, LOOKBACK, LIMIT, COLUMNS, OPTIONS
_extract_clause: connection | strategy | cdc_order | scope | partitions | lookback | limit
    | typed_columns | extract_options | comment
connection: "CONNECTION"i (STRING | env)
env: "ENV"i STRING
strategy: "STRATEGY"i IDENT
cdc_order: "ORDER"i "BY"i ordered ("," ordered)*
ordered: column IDENT?
scope: "WHERE"i expr
partitions: "PARTITIONS"i "(" STRING ("," STRING)* ")"
lookback: "LOOKBACK"i (STRING | NUMBER)
limit: "LIMIT"i NUMBER
typed_columns: "COLUMNS"i schema
extract_options: "OPTIONS"i "(" prop ("," prop)* ")"
// a Debezium connector's Kafka topics: FROM KAFKA, TOPICS or TOPIC PATTERN, CONNECTOR,
// SCHEMA (the row's columns; default: the events' schemas), TABLE (one table of a
// multi-table topic), OPTIONS (Spark's), TRANSACTION ID AS column (a column for each
// change's transaction id)
_debezium_clause: kafka | topics | topic_pattern | connector | row_schema | source_table
    | transaction_column | extract_options | comment
kafka: "FROM"i "KAFKA"i STRING
topics: "TOPICS"i "(" STRING ("," STRING)* ")"
topic_pattern: "TOPIC"i "PATTERN"i STRING
connector: "CONNECTOR"i IDENT
row_schema: "SCHEMA"i schema
source_table: "TABLE"i STRING
transaction_column: "TRANSACTION"i "ID"i "AS"i column

name: _ident ("." _ident)*
_ident: IDENT | QUOTED_IDENT
// the insert target has rules of its own for the same reason as raw spans: after a shared
// `name`, a query starting with FROM would lex as the FROM of AUTO CDC INTO t FROM s
target: _target
_target: IDENT | QUOTED_IDENT | _target "." IDENT | _target "." QUOTED_IDENT
_columns: column ("," column)*
column: _ident

query: _query
_query: {_HEAD} | _query ({_ITEM})
expr: _expr
_expr: {_HEAD} | _expr ({_ITEM})
_inner: ({_ITEM})+
set_key: (IDENT | QUOTED_IDENT | STRING | NUMBER | OP | ".")+

STREAM: "STREAM"i
IDENT: /[^\W\d]\w*/
QUOTED_IDENT: /{_QUOTED_IDENT}/
STRING: /{_STRING}/
NUMBER: /\d+(?:\.\d*)?(?:[eE][+-]?\d+)?\w*/
OP: /(?!\/\*)[^\s\w'"`();,.=*]/
SQL_COMMENT: /--[^\n]*|\/\*[\s\S]*?\*\//
%ignore SQL_COMMENT
%ignore /\s+/
"""


class _WholeWords:
    """Keeps IDENT in every lexer state, so `CREATED` lexes as a word, not CREATE + D."""

    always_accept = ("IDENT",)

    def process(self, stream: Iterator[Token]) -> Iterator[Token]:
        return stream


_PARSER = Lark(
    _GRAMMAR, parser="lalr", lexer="contextual", propagate_positions=True, postlex=_WholeWords()
)


class PipelineSqlSyntaxError(PipelineError):
    error_class = "AUTOCDC_PIPELINE_SQL_SYNTAX"
    template = "{file}:{line}:{column}: {problem}. Expected {expected}. {hint}"


@dataclass(frozen=True)
class Location:
    file: str  # the path given to parse()
    line: int  # 1-based line of the statement's first token
    column: int  # 1-based


@dataclass(frozen=True)
class CreateDataset:
    kind: Literal["streaming_table", "materialized_view", "temporary_view"]
    name: str
    query: str | None  # text after AS (None: streaming table without AS)
    schema: str | None  # column definitions text inside the parentheses, verbatim
    comment: str | None
    properties: dict[str, str]  # TBLPROPERTIES
    partition_cols: list[str] | None
    cluster_by: list[str] | None
    format: str | None  # USING
    location: Location


@dataclass(frozen=True)
class InsertFlow:
    name: str
    target: str
    query: str
    comment: str | None
    location: Location


@dataclass(frozen=True)
class AutoCdcStatement:
    name: str  # flow name (target when not given)
    target: str
    source: str
    streaming: bool  # STREAM(...) or STREAM name
    keys: list[str]
    sequence_by: str | None  # None: the source's BigQuery-style change columns
    apply_as_deletes: str | None
    apply_as_truncates: str | None
    column_list: list[str] | None
    except_column_list: list[str] | None
    stored_as_scd_type: int  # 1 unless STORED AS SCD TYPE 2
    track_history_column_list: list[str] | None
    track_history_except_column_list: list[str] | None
    ignore_null_updates: bool
    location: Location
    once: bool = False  # AUTO CDC ONCE: a backfill, run by the first run (and full refreshes)
    columns_to_update: list[str] | str | None = None  # COLUMNS TO UPDATE col | (a, b)
    ignore_null_updates_column_list: list[str] | None = None  # IGNORE NULL UPDATES ON a, b
    ignore_null_updates_except_column_list: list[str] | None = None  # ... ON * EXCEPT (a)
    sequence_group: str | None = None  # SEQUENCE GROUP g IN (g (a, b), h (c))
    apply_as_upserts: str | None = None  # APPLY AS UPSERT WHEN: the rest is quarantined
    sequence_groups: dict[str, list[str]] | None = None
    max_staleness: str | None = None  # MAX STALENESS INTERVAL 10 MINUTES, as an interval text
    max_staged_rows: int | None = None  # MAX STAGED ROWS 100000


@dataclass(frozen=True)
class AutoCdcSnapshotStatement:
    name: str  # flow name (target when not given)
    target: str
    source: str  # a table or view, read whole as each run's snapshot
    keys: list[str]
    stored_as_scd_type: int  # 1 unless STORED AS SCD TYPE 2
    track_history_column_list: list[str] | None
    track_history_except_column_list: list[str] | None
    location: Location
    sequence_by: str | None = None  # the snapshot's position on its change flows' clock


@dataclass(frozen=True)
class ExtractionStatement:
    """CREATE EXTRACTION SOURCE: :class:`autocdc.sources.extract.Extraction`'s options, as
    written (checked when the source is declared from them)."""

    name: str
    table: str
    dsn: str | None  # CONNECTION '...'
    dsn_env: str | None  # CONNECTION ENV 'VAR': the environment variable holding it
    options: dict[str, Any]  # strategy, cdc_order, where, partitions, lookback, limit, ...
    location: Location


@dataclass(frozen=True)
class DebeziumStatement:
    """CREATE DEBEZIUM SOURCE: :func:`autocdc.debezium_kafka`'s arguments, as written."""

    name: str
    options: dict[str, Any]  # bootstrap_servers, topics | topic_pattern, connector, ...
    location: Location


@dataclass(frozen=True)
class SetConf:
    key: str
    value: str
    location: Location


Statement = (
    CreateDataset
    | InsertFlow
    | AutoCdcStatement
    | AutoCdcSnapshotStatement
    | ExtractionStatement
    | DebeziumStatement
    | SetConf
)

_SUPPORTED = (
    "Supported statements: CREATE [OR REFRESH] STREAMING TABLE, CREATE [OR REFRESH] "
    "MATERIALIZED VIEW, CREATE TEMPORARY VIEW, CREATE FLOW, AUTO CDC INTO (or APPLY "
    "CHANGES INTO), CREATE EXTRACTION SOURCE, CREATE DEBEZIUM SOURCE and SET; run anything "
    "else outside the pipeline."
)
_GENERIC_HINT = "Check for a misspelled keyword or a missing `;` between statements."
# How lark's terminals read in messages, in the order they are listed there; other
# keywords (AS, KEYS, ...) read as themselves, punctuation as `(`.
_READABLE = {
    "CREATE": "CREATE",
    "OR": "OR REFRESH",
    "STREAMING": "STREAMING TABLE",
    "MATERIALIZED": "MATERIALIZED VIEW",
    "TEMPORARY": "TEMPORARY VIEW",
    "FLOW": "FLOW",
    "EXTRACTION": "EXTRACTION SOURCE",
    "DEBEZIUM": "DEBEZIUM SOURCE",
    "AUTO": "AUTO CDC INTO",
    "IGNORE": "IGNORE NULL UPDATES",
    "ONCE": "ONCE",
    "APPLY": "APPLY AS ... WHEN",
    "SEQUENCE": "SEQUENCE BY",
    "COLUMNS": "COLUMNS",
    "STORED": "STORED AS SCD TYPE",
    "TRACK": "TRACK HISTORY ON",
    "PARTITIONED": "PARTITIONED BY",
    "CLUSTER": "CLUSTER BY",
    "OP": "a query or expression",
    "IDENT": "a name",
    "QUOTED_IDENT": "a `backticked` name",
    "STRING": "a quoted string",
    "NUMBER": "a number",
}
_RANK = {term: rank for rank, term in enumerate(_READABLE)}
_EXPRESSION_PARTS = {"IDENT", "QUOTED_IDENT", "STRING", "NUMBER", "LPAR", "DOT", "COMMA"}
_EXPRESSION_PARTS |= {"EQUAL", "STAR"}
_CLAUSE_WORDS = {
    "comment": "COMMENT",
    "partition_cols": "PARTITIONED BY",
    "cluster_by": "CLUSTER BY",
    "properties": "TBLPROPERTIES",
    "format": "USING",
    "ignore_null_updates": "IGNORE NULL UPDATES",
    "apply_as_deletes": "APPLY AS DELETE WHEN",
    "apply_as_truncates": "APPLY AS TRUNCATE WHEN",
    "apply_as_upserts": "APPLY AS UPSERT WHEN",
    "sequence_by": "SEQUENCE BY",
    "columns": "COLUMNS",
    "columns_to_update": "COLUMNS TO UPDATE",
    "stored_as_scd_type": "STORED AS",
    "track_history": "TRACK HISTORY ON",
    "sequence_group": "SEQUENCE GROUP",
    "max_staleness": "MAX STALENESS",
    "max_staged_rows": "MAX STAGED ROWS",
    "connection": "CONNECTION",
    "strategy": "STRATEGY",
    "cdc_order": "ORDER BY",
    "scope": "WHERE",
    "partitions": "PARTITIONS",
    "lookback": "LOOKBACK",
    "limit": "LIMIT",
    "typed_columns": "COLUMNS",
    "extract_options": "OPTIONS",
    "kafka": "FROM KAFKA",
    "topics": "TOPICS",
    "topic_pattern": "TOPIC PATTERN",
    "connector": "CONNECTOR",
    "row_schema": "SCHEMA",
    "source_table": "TABLE",
    "transaction_column": "TRANSACTION ID AS",
}
_PLAIN_NAME = re.compile(r"[^\W\d]\w*")
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "0": "\0"}


class _Clause(NamedTuple):
    key: str
    value: list[Any]
    meta: Meta


def _ident(token: Token) -> str:
    """An identifier's plain text: backticks removed, doubled backticks undone."""
    return token[1:-1].replace("``", "`") if token.type == "QUOTED_IDENT" else str(token)


def _unquote(text: str) -> str:
    """The value of a string literal or backticked name (Spark escapes), else the text."""
    quote = text[:1]
    if quote == "`" and re.fullmatch(_QUOTED_IDENT, text):
        return text[1:-1].replace("``", "`")
    if not re.fullmatch(_STRING, text):
        return str(text)
    return re.sub(
        rf"\\([\s\S])|{quote}{quote}",
        lambda m: _ESCAPES.get(m[1], m[1]) if m[1] is not None else quote,
        text[1:-1],
    )


def _number(token: Token) -> int | Decimal:
    """A NUMBER token's value: an int, else exact."""
    text = str(token)
    return int(text) if text.isdigit() else Decimal(text)


# OPTIONS keys that configure a JDBC source's connection and read (the rest: how a run reads)
JDBC_OPTIONS = ("user", "password_env", "password_file", "partition_column", "num_partitions")


def _option(text: str) -> Any:
    """An OPTIONS value: ``true``/``false``, a number, else the text."""
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    return int(text) if text.isdigit() else text


def _first(clauses: dict[str, list[Any]], key: str) -> str | None:
    """A single-valued clause's value, None when the clause is absent."""
    return str(clauses[key][0]) if key in clauses else None


def _error(file: str, line: int, column: int, problem: str, expected: str, hint: str) -> Exception:
    return PipelineSqlSyntaxError(
        file=file, line=line, column=column, problem=problem, expected=expected, hint=hint
    )


@v_args(meta=True)
class _Builder(Transformer):
    """Turns the parse tree into statements; raw spans are sliced from the original text.

    Each clause rule is named after its key and becomes a ``_Clause`` of its children, so
    a statement sees its clauses in one place and can reject one given twice.
    """

    def __init__(self, text: str, file: str) -> None:
        super().__init__()
        self._text, self._file = text, file

    def start(self, meta: Meta, statements: list[Statement]) -> list[Statement]:
        return statements

    def __default__(self, data: str, children: list[Any], meta: Meta) -> _Clause:
        return _Clause(data, children, meta)

    def _loc(self, meta: Meta) -> Location:
        return Location(self._file, meta.line, meta.column)

    def _split(self, children: list[Any]) -> tuple[list[str], dict[str, list[Any]]]:
        """The statement's names in order, and its clauses by key."""
        names, clauses = [], {}
        for child in children:
            if not isinstance(child, _Clause):
                names.append(child)
            elif child.key in clauses:
                word = _CLAUSE_WORDS[child.key]
                raise _error(
                    self._file, child.meta.line, child.meta.column, f"{word} is given twice",
                    "each clause at most once", f"Remove one of the {word} clauses.",
                )  # fmt: skip
            else:
                clauses[child.key] = child.value
        return names, clauses

    def _dataset(self, kind: Any, meta: Meta, children: list[Any]) -> CreateDataset:
        (name,), c = self._split(children)
        return CreateDataset(
            kind=kind,
            name=name,
            query=_first(c, "query"),
            schema=_first(c, "schema"),
            comment=_first(c, "comment"),
            properties=dict(c.get("properties", [])),
            partition_cols=c.get("partition_cols"),
            cluster_by=c.get("cluster_by"),
            format=_first(c, "format"),
            location=self._loc(meta),
        )

    def streaming_table(self, meta: Meta, children: list[Any]) -> CreateDataset:
        return self._dataset("streaming_table", meta, children)

    def materialized_view(self, meta: Meta, children: list[Any]) -> CreateDataset:
        return self._dataset("materialized_view", meta, children)

    def temporary_view(self, meta: Meta, children: list[Any]) -> CreateDataset:
        return self._dataset("temporary_view", meta, children)

    def insert_flow(self, meta: Meta, children: list[Any]) -> InsertFlow:
        (name, target), c = self._split(children)
        return InsertFlow(name, target, c["query"][0], _first(c, "comment"), self._loc(meta))

    def _scd_type(self, clauses: dict[str, list[Any]]) -> int:
        (scd_type,) = clauses.get("stored_as_scd_type", ["1"])
        if scd_type not in ("1", "2"):
            raise _error(
                self._file, scd_type.line, scd_type.column, f"SCD TYPE {scd_type} is not supported",
                "SCD TYPE 1 or SCD TYPE 2", "Use 1 to keep the latest row, 2 to keep history.",
            )  # fmt: skip
        return int(scd_type)

    def cdc_flow(self, meta: Meta, children: list[Any]) -> AutoCdcStatement:
        names, c = self._split(children)
        scd_type = self._scd_type(c)
        columns, except_columns = (c.get("columns") or [(None, None)])[0]
        track, except_track = (c.get("track_history") or [(None, None)])[0]
        ignoring, except_ignoring = (c.get("ignore_null_updates") or [(None, None)])[0]
        (to_update,) = c.get("columns_to_update", [None])
        group, groups = c.get("sequence_group") or (None, None)
        once = "once" in c
        (rows,) = c.get("max_staged_rows", [None])
        return AutoCdcStatement(
            name=names[0],
            target=names[-1],
            source=c["source"][-1],
            streaming=len(c["source"]) == 2 and not once,
            keys=c["keys"],
            sequence_by=_first(c, "sequence_by"),
            apply_as_deletes=_first(c, "apply_as_deletes"),
            apply_as_truncates=_first(c, "apply_as_truncates"),
            apply_as_upserts=_first(c, "apply_as_upserts"),
            column_list=columns,
            except_column_list=except_columns,
            stored_as_scd_type=scd_type,
            track_history_column_list=track,
            track_history_except_column_list=except_track,
            ignore_null_updates="ignore_null_updates" in c and c["ignore_null_updates"] == [],
            location=self._loc(meta),
            once=once,
            columns_to_update=to_update[0] if isinstance(to_update, tuple) else to_update,
            ignore_null_updates_column_list=ignoring,
            ignore_null_updates_except_column_list=except_ignoring,
            sequence_group=group,
            sequence_groups=groups,
            max_staleness=c["max_staleness"][0] if "max_staleness" in c else None,
            max_staged_rows=None if rows is None else int(_number(rows)),
        )

    def max_staleness(self, meta: Meta, children: list[Any]) -> _Clause:
        """The interval as text the engine reads: ``'10 minutes'`` or ``10 MINUTES``."""
        if len(children) == 1 and isinstance(children[0], Token):
            return _Clause("max_staleness", [_unquote(children[0])], meta)
        return _Clause("max_staleness", [" ".join(children)], meta)

    def amount(self, meta: Meta, children: list[Token]) -> str:
        return f"{children[0]} {children[1]}"

    def snapshot_flow(self, meta: Meta, children: list[Any]) -> AutoCdcSnapshotStatement:
        names, c = self._split(children)
        track, except_track = (c.get("track_history") or [(None, None)])[0]
        return AutoCdcSnapshotStatement(
            name=names[0],
            target=names[-1],
            source=c["snapshot"][0],
            keys=c["keys"],
            stored_as_scd_type=self._scd_type(c),
            track_history_column_list=track,
            track_history_except_column_list=except_track,
            location=self._loc(meta),
            sequence_by=_first(c, "sequence_by"),
        )

    def extraction_source(self, meta: Meta, children: list[Any]) -> ExtractionStatement:
        (name, table), c = self._split(children)
        if "connection" not in c:
            raise _error(
                self._file, meta.line, meta.column, f"extraction source {name} has no CONNECTION",
                "CONNECTION 'libpq connection string' or CONNECTION ENV 'VARIABLE'",
                "Add the clause; keep a password out of the file (PGPASSWORD, ~/.pgpass, "
                "or the whole string in an environment variable).",
            )  # fmt: skip
        (connection,) = c["connection"]
        options: dict[str, Any] = {}
        if "strategy" in c:
            options["strategy"] = str(c["strategy"][0])
        if "cdc_order" in c:
            options["cdc_order"] = c["cdc_order"]
        if "scope" in c:
            options["where"] = c["scope"][0]
        if "partitions" in c:
            options["partitions"] = [_unquote(p) for p in c["partitions"]]
        if "lookback" in c:
            (given,) = c["lookback"]
            options["lookback"] = _unquote(given) if given.type == "STRING" else _number(given)
        if "limit" in c:
            options["limit"] = _number(c["limit"][0])
        if "typed_columns" in c:
            options["columns"] = c["typed_columns"][0].value[0]
        if "extract_options" in c:
            given = {k: _option(v) for k, v in c["extract_options"]}
            options |= {k: given.pop(k) for k in JDBC_OPTIONS if k in given}
            options["options"] = given
        env = isinstance(connection, _Clause)
        return ExtractionStatement(
            name=name,
            table=table,
            dsn=None if env else _unquote(connection),
            dsn_env=_unquote(connection.value[0]) if env else None,
            options=options,
            location=self._loc(meta),
        )

    def debezium_source(self, meta: Meta, children: list[Any]) -> DebeziumStatement:
        (name,), c = self._split(children)
        for key, clause in (("kafka", "FROM KAFKA 'host:port'"), ("connector", "CONNECTOR")):
            if key not in c:
                raise _error(
                    self._file, meta.line, meta.column, f"Debezium source {name} has no "
                    f"{_CLAUSE_WORDS[key]}", clause, f"Add {clause} to the statement.",
                )  # fmt: skip
        if ("topics" in c) == ("topic_pattern" in c):
            raise _error(
                self._file, meta.line, meta.column,
                f"Debezium source {name} needs one of TOPICS or TOPIC PATTERN",
                "TOPICS ('a', ...) or TOPIC PATTERN 'regex'",
                "Name the topics, or a pattern.",
            )  # fmt: skip
        options: dict[str, Any] = {
            "bootstrap_servers": _unquote(c["kafka"][0]),
            "connector": str(c["connector"][0]).lower(),
        }
        if "row_schema" in c:
            options["row_schema"] = c["row_schema"][0].value[0]
        if "topics" in c:
            options["topics"] = [_unquote(t) for t in c["topics"]]
        else:
            options["topic_pattern"] = _unquote(c["topic_pattern"][0])
        if "source_table" in c:
            options["table"] = _unquote(c["source_table"][0])
        if "transaction_column" in c:
            options["transaction_id"] = c["transaction_column"][0]
        if "extract_options" in c:
            options["options"] = dict(c["extract_options"])
        return DebeziumStatement(name, options, self._loc(meta))

    def ordered(self, meta: Meta, children: list[Any]) -> str:
        column, *direction = children
        if direction and direction[0].upper() not in ("ASC", "DESC"):
            word = direction[0]
            raise _error(
                self._file, word.line, word.column, f"unexpected `{word}`",
                "ASC, DESC, `,` or the next clause", "Order each column ASC or DESC.",
            )  # fmt: skip
        quoted = '"' + column.replace('"', '""') + '"'
        return " ".join([quoted, *map(str, direction)])

    def set_conf(self, meta: Meta, children: list[Any]) -> SetConf:
        key, value = children
        return SetConf(_unquote(key), _unquote(value.value[0]), self._loc(meta))

    def name(self, meta: Meta, tokens: list[Token]) -> str:
        parts = (_ident(t) for t in tokens)
        return ".".join(
            p if _PLAIN_NAME.fullmatch(p) else "`" + p.replace("`", "``") + "`" for p in parts
        )

    target = name

    def column(self, meta: Meta, tokens: list[Token]) -> str:
        return _ident(tokens[0])

    def sequence_group(self, meta: Meta, children: list[Any]) -> _Clause:
        own, *groups = children
        return _Clause("sequence_group", [own, dict(groups)], meta)

    def group_def(self, meta: Meta, children: list[str]) -> tuple[str, list[str]]:
        return children[0], children[1:]

    def column_list(self, meta: Meta, columns: list[str]) -> tuple[list[str] | None, ...]:
        return columns, None

    def except_list(self, meta: Meta, columns: list[str]) -> tuple[list[str] | None, ...]:
        return None, columns

    def comment(self, meta: Meta, children: list[Token]) -> _Clause:
        return _Clause("comment", [_unquote(children[0])], meta)

    def prop(self, meta: Meta, children: list[str]) -> tuple[str, str]:
        return _unquote(children[0]), _unquote(children[-1])

    def expr(self, meta: Meta, _: list[Any]) -> str:
        return self._text[meta.start_pos : meta.end_pos]

    set_key = expr

    def query(self, meta: Meta, _: list[Any]) -> _Clause:
        return _Clause("query", [self.expr(meta, _)], meta)

    def schema(self, meta: Meta, _: list[Any]) -> _Clause:
        return _Clause("schema", [self._text[meta.start_pos + 1 : meta.end_pos - 1].strip()], meta)


def _expected(accepted: set[str]) -> str:
    """Lark's acceptable terminals as words a SQL author knows."""
    if "OP" in accepted:
        accepted -= _EXPRESSION_PARTS
    if "IDENT" in accepted:
        accepted -= {"QUOTED_IDENT"}

    def word(term: str) -> str:
        if term == "APPLY" and "AUTO" in accepted:
            return "APPLY CHANGES INTO"
        if term == "$END":
            return "end of input"
        value = _PARSER.get_terminal(term).pattern.value
        return _READABLE.get(term, value if value.isalpha() else f"`{value}`")

    def rank(term: str) -> tuple[int, bool, bool, str]:
        return _RANK.get(term, len(_RANK)), term == "$END", not word(term).isalpha(), term

    words = [word(t) for t in sorted(accepted, key=rank)]
    return words[0] if len(words) == 1 else "one of: " + ", ".join(words)


def _syntax_error(err: UnexpectedInput, text: str, file: str) -> Exception:
    accepted = err.interactive_parser.accepts()
    hint = _SUPPORTED if accepted & {"CREATE", "STREAMING"} else _GENERIC_HINT
    line, column = err.line, err.column
    if isinstance(err, UnexpectedToken) and err.token.type == "$END":
        problem = "the statement ends too early"
        line, column = err.token.end_line or 1, err.token.end_column or 1
    elif isinstance(err, UnexpectedToken):
        problem = f"unexpected `{err.token}`"
    elif isinstance(err, UnexpectedCharacters) and text.startswith("/*", err.pos_in_stream):
        problem = "a /* comment is never closed"
    elif isinstance(err, UnexpectedCharacters) and err.char in "'\"`":
        what = "name" if err.char == "`" else "string"
        problem = f"a {what} opened with {err.char} is never closed"
    else:
        problem = f"unexpected character `{err.char}`"
    return _error(file, line, column, problem, _expected(accepted), hint)


def parse(text: str, file: str) -> list[Statement]:
    """Parses a pipeline SQL file; ``file`` only labels locations and errors."""
    try:
        return _Builder(text, file).transform(_PARSER.parse(text))
    except UnexpectedInput as err:
        raise _syntax_error(err, text, file) from None
    except VisitError as err:
        raise err.orig_exc from None
