"""Collect a pipeline's definitions: Python files (``pyspark.pipelines`` or
``autocdc.pipelines``) and SQL files, into datasets and flows.

pyspark's ``dp`` functions send each definition to the registry active at call time, so
implementing :class:`GraphElementRegistry` is all it takes for files written for Spark's
own CLI to load unchanged.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib.util
import os
import re
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import ValidationError
from pyspark.errors import PySparkException
from pyspark.pipelines import flow as sdp_flow
from pyspark.pipelines import output as sdp_output
from pyspark.pipelines.graph_element_registry import (
    GraphElementRegistry,
    graph_element_registration_context,
)
from pyspark.pipelines.source_code_location import SourceCodeLocation
from pyspark.sql import Column, DataFrame, SparkSession

from autocdc.engine import FlowDefinition, NextSnapshot, SnapshotDefinition
from autocdc.pipelines.declare import sql
from autocdc.pipelines.declare.project import Project
from autocdc.pipelines.errors import (
    DuplicateDatasetError,
    DuplicateFlowError,
    FlowAnalysisError,
    PipelineDefinitionError,
)
from autocdc.runtime import AutoCdcError
from autocdc.sources import debezium
from autocdc.sources.extract import Extraction, ExtractionOptions

Kind = Literal["streaming_table", "materialized_view", "temporary_view"]
KINDS: dict[type, Kind] = {
    sdp_output.MaterializedView: "materialized_view",
    sdp_output.StreamingTable: "streaming_table",
    sdp_output.TemporaryView: "temporary_view",
}


@dataclass(frozen=True)
class Dataset:
    name: str
    kind: Kind
    where: str
    schema: Any = None  # StructType or DDL string, as declared
    table_properties: dict[str, str] = field(default_factory=dict)
    partition_cols: list[str] | None = None
    cluster_by: list[str] | None = None


@dataclass(frozen=True)
class QueryFlow:
    """A query whose rows go into ``target``: a dataset's own query or an append flow."""

    name: str
    target: str
    query: Callable[[], DataFrame]
    where: str
    spark_conf: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class CdcFlow:
    """An AUTO CDC flow: ``source`` applied to ``target`` as ``definition`` says, checked
    once, where it was declared (its target as declared: a run builds the running flow
    from it, at the qualified target).

    ``streaming``: the source is read as a stream (else as one batch, every run).
    ``once``: a backfill, read as one batch by the first run and after a full refresh of
    its target only (the runner records in its checkpoint folder that it ran). When
    ``source`` names an extraction source, ``extraction`` is it (set by :func:`load`)."""

    name: str
    target: str
    source: str
    where: str
    definition: FlowDefinition
    streaming: bool = True
    once: bool = False
    extract_options: ExtractionOptions | None = None
    extraction: Extraction | None = None


@dataclass(frozen=True)
class ExtractionSource:
    """A source declared with ``dp.create_extraction_source``; flows name it."""

    extraction: Extraction
    where: str


@dataclass(frozen=True)
class SnapshotFlow:
    """An AUTO CDC FROM SNAPSHOT flow: ``source`` (a table or view, read whole each run, or
    a ``next_snapshot(latest_version)`` function) applied to ``target`` as ``definition``
    says, checked once, where it was declared."""

    name: str
    target: str
    source: str | NextSnapshot
    where: str
    definition: SnapshotDefinition
    extraction: Extraction | None = None  # a STATELESS source's, set by :func:`load`


Flow = QueryFlow | CdcFlow | SnapshotFlow


Definition = TypeVar("Definition", FlowDefinition, SnapshotDefinition)


def declared(kind: type[Definition], at: str, **fields: Any) -> Definition:
    """A definition of pyspark's ``dp`` or SQL, checked now: a bad option is refused
    naming the line (``at``) and the flow, the engine's error as it is (its class and
    code), pydantic's wrapped (its messages, its cause)."""
    name = fields.get("name") or fields["target"]
    try:
        return kind(**fields)
    except AutoCdcError as error:
        raise error.located(at, name) from error
    except ValidationError as error:
        said = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in error.errors())
        raise FlowAnalysisError(where=at, flow=name, problem=said) from error


def where(location: SourceCodeLocation | sql.Location) -> str:
    """``file:line``, relative to the current folder (the project root while loading)."""
    if isinstance(location, sql.Location):
        return f"{location.file}:{location.line}"
    filename = location.filename
    with contextlib.suppress(ValueError):
        filename = os.path.relpath(filename)
    return f"{filename}:{location.line_number}" if location.line_number else filename


def column_text(value: Any) -> Any:
    """A Spark Connect column (pyspark's ``dp`` builds them from strings) back to its SQL
    text, so the classic session can run it; anything else unchanged."""
    if isinstance(value, list):
        return [column_text(v) for v in value]
    expression = getattr(value, "_expr", None)
    if isinstance(value, Column) and expression is not None:
        if hasattr(expression, "_unparsed_identifier"):
            return expression._unparsed_identifier.strip("`")
        if isinstance(getattr(expression, "_expr", None), str):
            return expression._expr
    return value


class Registry(GraphElementRegistry):
    """Datasets and flows by name, each with the place it was defined."""

    def __init__(self, spark: SparkSession) -> None:
        self.spark = spark
        # The SQL files' SET values: set while the pipeline resolves and runs, not on the
        # session when they are read (a run gives the session back as it found it).
        self.conf: dict[str, str] = {}
        self.datasets: dict[str, Dataset] = {}
        self.flows: dict[str, Flow] = {}
        self.extractions: dict[str, ExtractionSource] = {}

    def add_dataset(self, dataset: Dataset) -> None:
        if dataset.name in self.datasets:
            first = self.datasets[dataset.name].where
            raise DuplicateDatasetError(where=dataset.where, name=dataset.name, first=first)
        self.datasets[dataset.name] = dataset

    def add_flow(self, flow: Flow) -> None:
        if flow.name in self.flows:
            first = self.flows[flow.name].where
            raise DuplicateFlowError(where=flow.where, name=flow.name, first=first)
        self.flows[flow.name] = flow

    def add_extraction(self, source: ExtractionSource) -> None:
        name = source.extraction.name
        if name in self.extractions:
            first = self.extractions[name].where
            raise DuplicateDatasetError(where=source.where, name=name, first=first)
        self.extractions[name] = source

    def add_debezium(self, name: str, at: str, **options: Any) -> None:
        """A view of the change rows of a Debezium connector's Kafka topics
        (:func:`autocdc.debezium_kafka`, with ``options``), checked now."""
        debezium.check(
            options.get("connector"), options.get("topics"), options.get("topic_pattern")
        )
        self.add_dataset(Dataset(name=name, kind="temporary_view", where=at))
        query = functools.partial(debezium.debezium_kafka, self.spark, **options)
        self.add_flow(QueryFlow(name, name, query, at))

    def link_extractions(self) -> None:
        """Give each flow that reads an extraction source its declaration; refuse what
        cannot be meant (a dataset of the same name, extraction options elsewhere)."""
        for name, source in self.extractions.items():
            if name in self.datasets:
                first = self.datasets[name].where
                raise DuplicateDatasetError(where=source.where, name=name, first=first)
        for name, flow in self.flows.items():
            if isinstance(flow, SnapshotFlow):
                self._link_snapshot(name, flow)
            if not isinstance(flow, CdcFlow):
                continue
            found = self.extractions.get(flow.source)
            if found is not None:
                self.flows[name] = replace(flow, extraction=found.extraction)
            elif flow.extract_options is not None:
                raise PipelineDefinitionError(
                    where=flow.where,
                    problem=f"flow `{name}` has extract_options, but its source "
                    f"`{flow.source}` is not an extraction source",
                    hint="Remove extract_options, or declare the source with "
                    "dp.create_extraction_source.",
                )

    def _link_snapshot(self, name: str, flow: SnapshotFlow) -> None:
        """A snapshot flow reads an extraction source whole each run: only a STATELESS one
        does (a WATERMARK or CUSTOM read lacks the rows that did not change, which a
        snapshot flow would delete)."""
        found = self.extractions.get(flow.source) if isinstance(flow.source, str) else None
        if found is None:
            return
        if found.extraction.keeps_checkpoint:
            raise PipelineDefinitionError(
                where=flow.where,
                problem=f"snapshot flow `{name}` reads `{flow.source}`, a "
                f"{found.extraction.strategy.value} extraction source: each run reads only "
                "the rows that changed, and the snapshot flow would delete every other key",
                hint="Declare the source with strategy='STATELESS' (every run reads it "
                "whole), or read it with dp.create_auto_cdc_flow.",
            )
        self.flows[name] = replace(flow, extraction=found.extraction)

    def register_output(self, output: sdp_output.Output) -> None:
        kind = KINDS.get(type(output))
        if kind is None:
            raise PipelineDefinitionError(
                where=where(output.source_code_location),
                problem=f"{type(output).__name__} `{output.name}` is not supported by autocdc",
                hint="Write into a streaming table or a materialized view instead.",
            )
        self.add_dataset(
            Dataset(
                name=output.name,
                kind=kind,
                where=where(output.source_code_location),
                schema=getattr(output, "schema", None),
                table_properties=dict(getattr(output, "table_properties", None) or {}),
                partition_cols=getattr(output, "partition_cols", None),
                cluster_by=list(getattr(output, "cluster_by", None) or []) or None,
            )
        )

    def register_flow(self, flow: sdp_flow.Flow) -> None:
        self.add_flow(
            QueryFlow(
                name=flow.name,
                target=flow.target,
                query=flow.func,
                where=where(flow.source_code_location),
                spark_conf=dict(flow.spark_conf),
            )
        )

    def register_auto_cdc_flow(self, flow: sdp_flow.AutoCdcFlow | CdcFlow | SnapshotFlow) -> None:
        if isinstance(flow, CdcFlow | SnapshotFlow):
            self.add_flow(flow)
            return
        options = {
            "keys": column_text(flow.keys),
            "sequence_by": column_text(flow.sequence_by),
            "apply_as_deletes": column_text(flow.apply_as_deletes),
            "column_list": column_text(flow.column_list),
            "except_column_list": column_text(flow.except_column_list),
            "stored_as_scd_type": int(flow.stored_as_scd_type or 1),
        }
        name, at = flow.name or flow.target, where(flow.source_code_location)
        given = {k: v for k, v in options.items() if v is not None}
        definition = declared(FlowDefinition, at, target=flow.target, name=name, **given)
        self.add_flow(CdcFlow(name, flow.target, flow.source, at, definition))

    def register_sql(self, sql_text: str, file_path: Path) -> None:
        for statement in sql.parse(sql_text, str(file_path)):
            self._register_statement(statement)

    def _register_statement(self, statement: sql.Statement) -> None:
        at = where(statement.location)
        if isinstance(statement, sql.SetConf):
            self.conf[statement.key] = statement.value
        elif isinstance(statement, sql.CreateDataset):
            self.add_dataset(
                Dataset(
                    name=statement.name,
                    kind=statement.kind,
                    where=at,
                    schema=statement.schema,
                    table_properties=statement.properties,
                    partition_cols=statement.partition_cols,
                    cluster_by=statement.cluster_by,
                )
            )
            if statement.query is not None:
                self.add_flow(
                    QueryFlow(statement.name, statement.name, self._sql(statement.query), at)
                )
        elif isinstance(statement, sql.InsertFlow):
            self.add_flow(
                QueryFlow(statement.name, statement.target, self._sql(statement.query), at)
            )
        elif isinstance(statement, sql.DebeziumStatement):
            self.add_debezium(statement.name, at, **statement.options)
        elif isinstance(statement, sql.ExtractionStatement):
            self.add_extraction(ExtractionSource(_extraction(statement, at), at))
        elif isinstance(statement, sql.AutoCdcSnapshotStatement):
            definition = _snapshot_definition(statement, at)
            self.add_flow(
                SnapshotFlow(statement.name, statement.target, statement.source, at, definition)
            )
        else:
            self.add_flow(
                CdcFlow(
                    name=statement.name,
                    target=statement.target,
                    source=statement.source,
                    where=at,
                    definition=_cdc_definition(statement, at),
                    streaming=statement.streaming,
                    once=statement.once,
                )
            )

    def _sql(self, text: str) -> Callable[[], DataFrame]:
        return lambda: self.spark.sql(text)


def _cdc_definition(statement: sql.AutoCdcStatement, at: str) -> FlowDefinition:
    """The definition an AUTO CDC statement declares: its fields of the definition's names
    (a clause it leaves out, None: the default)."""
    fields = [
        f.name for f in dataclasses.fields(statement) if f.name in FlowDefinition.model_fields
    ]
    clauses = {name: getattr(statement, name) for name in fields}
    return declared(
        FlowDefinition, at, **{name: value for name, value in clauses.items() if value is not None}
    )


def _snapshot_definition(statement: sql.AutoCdcSnapshotStatement, at: str) -> SnapshotDefinition:
    """The definition an AUTO CDC FROM SNAPSHOT statement declares (a clause it leaves
    out: the default)."""
    clauses = {
        "track_history_column_list": statement.track_history_column_list,
        "track_history_except_column_list": statement.track_history_except_column_list,
        "sequence_by": statement.sequence_by,
    }
    return declared(
        SnapshotDefinition,
        at,
        target=statement.target,
        name=statement.name,
        keys=statement.keys,
        stored_as_scd_type=statement.stored_as_scd_type,
        **{clause: value for clause, value in clauses.items() if value is not None},
    )


def _extraction(statement: sql.ExtractionStatement, at: str) -> Extraction:
    """The source a CREATE EXTRACTION SOURCE declares; ``CONNECTION ENV`` is read now, so a
    connection string with a password need not be written in the file. A connection that
    starts with ``jdbc:`` is a JDBC URL (any database, read by Spark), else libpq's."""
    dsn = statement.dsn
    if statement.dsn_env is not None:
        dsn = os.environ.get(statement.dsn_env)
        if not dsn:
            raise PipelineDefinitionError(
                where=at,
                problem=f"extraction source `{statement.name}` reads its connection string "
                f"from the environment variable {statement.dsn_env}, which is not set",
                hint=f"Set {statement.dsn_env} to a libpq connection string or a JDBC URL "
                "before the run.",
            )
    return Extraction(name=statement.name, dsn=dsn, table=statement.table, **statement.options)


def _failure_site(error: BaseException, file: Path) -> str:
    """The deepest line of ``file`` in the error's traceback (where the user's code broke)."""
    frames = [f for f in traceback.extract_tb(error.__traceback__) if Path(f.filename) == file]
    return f"{os.path.relpath(file)}:{frames[-1].lineno}" if frames else os.path.relpath(file)


def _import(path: Path, spark: SparkSession) -> None:
    """Execute a Python library file as a module, with ``spark`` as a global (as in SDP)."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    module.__dict__["spark"] = spark
    try:
        spec.loader.exec_module(module)
    except AutoCdcError:
        raise
    except PySparkException as error:
        hint = "Fix the definition."
        if error.getMessageParameters().get("arg_name") == "stored_as_scd_type":
            hint = (
                "pyspark's own create_auto_cdc_flow supports SCD type 1 only: import "
                "`from autocdc import pipelines as dp` for type 2 and the other options."
            )
        raise PipelineDefinitionError(
            where=_failure_site(error, path), problem=str(error), hint=hint
        ) from error
    except Exception as error:
        raise PipelineDefinitionError(
            where=_failure_site(error, path),
            problem=f"{type(error).__name__}: {error}",
            hint=_autocdc_keyword(error) or "Fix the library file.",
        ) from error


_UNEXPECTED = re.compile(r"(\w+)\(\) got an unexpected keyword argument '(\w+)'")


def _autocdc_keyword(error: Exception) -> str | None:
    """The hint for a keyword pyspark's ``dp`` lacks and autocdc's has (``max_staleness=``
    given to pyspark's ``create_auto_cdc_flow``): a file written with
    ``from pyspark import pipelines as dp`` gets a bare TypeError otherwise. autocdc's
    ``dp`` takes its definitions' fields (a parity test holds them equal)."""
    found = _UNEXPECTED.search(str(error)) if isinstance(error, TypeError) else None
    if found is None or found[2] not in _AUTOCDC_OPTIONS.get(found[1], ()):
        return None
    function, keyword = found[1], found[2]
    return (
        f"`{keyword}` is an option of autocdc's {function}, not of pyspark's: import "
        "`from autocdc import pipelines as dp` (the same functions, with autocdc's options)."
    )


_AUTOCDC_OPTIONS = {
    "create_auto_cdc_flow": {*FlowDefinition.model_fields, "once", "extract_options"},
    "create_auto_cdc_from_snapshot_flow": set(SnapshotDefinition.model_fields),
}


def load(project: Project, spark: SparkSession) -> Registry:
    """Every definition of the project's library files, in file order (relative paths in
    them are the current folder's: :func:`autocdc.pipelines.execute.pipeline.in_project`
    makes it the project's)."""
    registry = Registry(spark)
    with graph_element_registration_context(registry):
        for path in project.library_files():
            if path.suffix == ".py":
                _import(path, spark)
            else:
                registry.register_sql(path.read_text(), path.relative_to(project.root))
    registry.link_extractions()
    return registry
