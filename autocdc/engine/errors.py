"""Errors with stable class names, and the quarantine reasons for bad rows.

Every message lives here, rendered as "what happened. What to do." Tests assert the
exception type and its ``params``, never the text, so wording can improve freely.
Bad *data* is never an exception: it becomes a quarantine row whose ``reason`` is one
of the ``QUARANTINE_*`` names below.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import re
import string
from typing import Any, ClassVar, TypeVar

# A record Spark could not parse or type (its corrupt-record column is set).
QUARANTINE_MALFORMED_RECORD = "AUTOCDC_MALFORMED_RECORD"
QUARANTINE_NULL_KEY = "AUTOCDC_NULL_KEY"
QUARANTINE_NULL_SEQUENCE = "AUTOCDC_NULL_SEQUENCE"
QUARANTINE_LATE_BEYOND_HORIZON = "AUTOCDC_LATE_BEYOND_HORIZON"
# BigQuery-style change rows (a flow with no sequence_by): see autocdc/engine/change_rows.py.
QUARANTINE_MALFORMED_SEQUENCE = "AUTOCDC_MALFORMED_SEQUENCE"
QUARANTINE_UNKNOWN_CHANGE_TYPE = "AUTOCDC_UNKNOWN_CHANGE_TYPE"
QUARANTINE_TRUNCATE_IN_SCD2 = "AUTOCDC_TRUNCATE_IN_SCD2"


_Error = TypeVar("_Error", bound="AutoCdcError")


class AutoCdcError(Exception):
    """Base of every autocdc error; ``error_class`` is stable, ``params`` are its facts.

    Deliberately not a ``ValueError``: pydantic wraps those into a generic
    ``ValidationError``, and we want callers to catch the precise class.
    """

    error_class: ClassVar[str] = "AUTOCDC_ERROR"
    template: ClassVar[str] = "{detail}"

    def __init__(self, **params: Any) -> None:
        self.params = params
        text = self.template.format(**params)
        if "where" in params and "{where}" not in self.template:  # see located()
            flow = "" if "{flow}" in self.template else f"flow `{params['flow']}`: "
            text = f"{params['where']}: {flow}{text}"
        super().__init__(f"[{self.error_class}] {text}")

    def located(self: _Error, where: str, flow: str) -> _Error:
        """This error, of its class and code, where a pipeline declares the flow it
        concerns: ``where`` (``file:line``) and ``flow`` join its params (a ``flow`` it
        names already is kept) and lead its message."""
        return type(self)(**{"flow": flow, **self.params, "where": where})


class EngineError(AutoCdcError):
    """An error of the engine (:mod:`autocdc.engine`): a flow's declaration refused, a
    batch or a table that cannot be applied. What ``AutoCdcFlow`` and
    ``AutoCdcSnapshotFlow`` raise."""


class EmptyKeysError(EngineError):
    error_class = "AUTOCDC_EMPTY_KEYS"
    template = "`keys` is empty. Name the column(s) that identify a row, e.g. keys=['id']."


class ConflictingColumnListsError(EngineError):
    error_class = "AUTOCDC_CONFLICTING_COLUMN_LISTS"
    template = (
        "Both `{first}` and `{second}` are set. Set at most one of them: the first keeps "
        "only the listed columns, the second keeps all but the listed ones."
    )


class KeyNotSelectedError(EngineError):
    error_class = "AUTOCDC_KEY_NOT_SELECTED"
    template = (
        "Key column(s) {columns} would be removed by `{field}`. Keys are always part of "
        "the target: add them to `column_list` or remove them from `except_column_list`."
    )


class UnknownColumnError(EngineError):
    error_class = "AUTOCDC_UNKNOWN_COLUMN"
    template = (
        "`{field}` names column(s) {columns} that the change feed does not have "
        "(it has {available}). Fix the spelling or remove them from `{field}`."
    )


class InvalidSequenceTypeError(EngineError):
    error_class = "AUTOCDC_INVALID_SEQUENCE_TYPE"
    template = (
        "`sequence_by` has type {type}, which cannot order changes. Use an integer, "
        "decimal, date, timestamp or string column, or a struct of them; for "
        "BigQuery/LSN-style strings use autocdc.hex_sequence()."
    )


class MissingSequenceError(EngineError):
    error_class = "AUTOCDC_MISSING_SEQUENCE"
    template = (
        "The flow has no `sequence_by`, and the change feed has no string "
        "`_CHANGE_SEQUENCE_NUMBER` column (found type: {type}; columns: {available}). Give "
        "`sequence_by` (the column or expression that orders the changes; a numeric "
        "`_CHANGE_SEQUENCE_NUMBER` can be it), or provide `_CHANGE_SEQUENCE_NUMBER` as text "
        "(BigQuery-style: 1 to 4 hex sections separated by '/', e.g. '16/B374D848')."
    )


class TruncateWithScd2Error(EngineError):
    error_class = "AUTOCDC_TRUNCATE_WITH_SCD2"
    template = (
        "`apply_as_truncates` is set on an SCD type 2 flow. A truncate would erase history; "
        "it is supported for stored_as_scd_type=1 only. Remove `apply_as_truncates` or use "
        "type 1."
    )


class TrackHistoryWithScd1Error(EngineError):
    error_class = "AUTOCDC_TRACK_HISTORY_WITH_SCD1"
    template = (
        "`{field}` is set on an SCD type 1 flow, which keeps no history. Remove it or use "
        "stored_as_scd_type=2."
    )


class ReservedColumnError(EngineError):
    error_class = "AUTOCDC_RESERVED_COLUMN"
    template = (
        "Column(s) {columns} collide with names autocdc reserves (`__START_AT`, `__END_AT`, "
        "anything starting with `__autocdc`, and in a snapshot `__snapshot_version` and "
        "`__snapshot_deleted`). Rename them in the source, e.g. with withColumnRenamed, "
        "before applying the flow."
    )


class SchemaMismatchError(EngineError):
    error_class = "AUTOCDC_SCHEMA_MISMATCH"
    template = (
        "The batch does not fit target `{target}`: {changed}. A batch may add nullable "
        "columns, leave columns out, and widen types (int to bigint, float to double, "
        "decimal precision up); anything else needs a cast in the source, "
        "`except_column_list`, or a full refresh."
    )


class InvalidSequenceValueError(EngineError):
    error_class = "AUTOCDC_INVALID_SEQUENCE_VALUE"
    template = "{value!r} is not a valid {kind}: {why}. Expected e.g. {example}."


class UnknownConnectorError(EngineError):
    error_class = "AUTOCDC_UNKNOWN_CONNECTOR"
    template = "Connector {connector!r} is not supported. Use one of {connectors}."


class DuplicateColumnError(EngineError):
    error_class = "AUTOCDC_DUPLICATE_COLUMN"
    template = "`{field}` names {columns} more than once. List each column once."


class TrackHistoryColumnNotSelectedError(EngineError):
    error_class = "AUTOCDC_TRACK_HISTORY_COLUMN_NOT_SELECTED"
    template = (
        "`{field}` names {columns}, which {why}, so tracking them would mean nothing. "
        "Name only selected, non-key columns in `{field}`."
    )


class ConflictingIgnoreNullUpdatesError(EngineError):
    error_class = "AUTOCDC_CONFLICTING_IGNORE_NULL_UPDATES"
    template = (
        "Both `{first}` and `{second}` are set. Set at most one of `ignore_null_updates` "
        "(every column), `ignore_null_updates_column_list` (only these columns) and "
        "`ignore_null_updates_except_column_list` (all but these columns)."
    )


class ColumnNotSelectedError(EngineError):
    error_class = "AUTOCDC_COLUMN_NOT_SELECTED"
    template = (
        "`{field}` names {columns}, which `column_list` / `except_column_list` leave out "
        "of the target, so an upsert could never set them. Name only selected columns "
        "in `{field}`, or select them."
    )


class InvalidColumnsToUpdateError(EngineError):
    error_class = "AUTOCDC_INVALID_COLUMNS_TO_UPDATE"
    template = (
        "`columns_to_update` names column `{column}` of type {type}: a column given by "
        "name must list, per row, the columns that row sets (array<string>; NULL sets "
        "every column). Cast it to array<string>, or pass the columns as a list, "
        "e.g. columns_to_update=['{column}']."
    )


class TargetNotPartialError(EngineError):
    error_class = "AUTOCDC_TARGET_NOT_PARTIAL"
    template = (
        "Flow `{flow}` sets only some columns of an upsert ({why}), but target `{target}` "
        "was created for full-row upserts: its state does not record which columns each "
        "upsert set, so the columns left out cannot be ordered. Declare "
        "partial_target=True on every flow into `{target}` (a pipeline does it for you) "
        "and rebuild it: {remedy} drops the target, its state and quarantine."
    )
    PYTHON_REMEDY = "flow.full_refresh(spark)"


class SequenceGroupsError(EngineError):
    error_class = "AUTOCDC_INVALID_SEQUENCE_GROUPS"
    template = (
        "Flow `{flow}` declares sequence groups that cannot work: {why}. Declare "
        "`sequence_groups` (each group's name and value columns, every value column in "
        "one group) the same way on every flow into the target, and `sequence_group` "
        "naming the flow's own group, whose clock is its `sequence_by` (SCD type 1 only, "
        "no truncates); see docs/semantics.md, sequence groups."
    )


class InvalidKeyTypeError(EngineError):
    error_class = "AUTOCDC_INVALID_KEY_TYPE"
    template = (
        "Key column `{column}` has type {type}, which cannot identify a row reliably "
        "(floating point keys compare NaN and -0.0 inexactly; maps have no equality). Cast "
        "it to a string, decimal or integer in the source, or choose another key."
    )


class NondeterministicExpressionError(EngineError):
    error_class = "AUTOCDC_NONDETERMINISTIC_EXPRESSION"
    template = (
        "`{field}` is not deterministic ({expression}): a replayed batch would be "
        "sequenced or classified differently. Use columns of the change itself (e.g. the "
        "source's commit position or timestamp), never rand() or uuid()."
    )


class InvalidRetentionError(EngineError):
    error_class = "AUTOCDC_INVALID_RETENTION"
    template = (
        "tombstone_retention_days={value} is out of range. Use a number of days from 0 to "
        "{maximum}."
    )


class DefinitionChangedError(EngineError):
    error_class = "AUTOCDC_DEFINITION_CHANGED"
    template = (
        "Target `{target}` was built with {field}={stored}, but the flow now declares "
        "{field}={declared}. The stored state means something else under the new "
        "definition. Restore the old value, or start over from the source with the new "
        "one: {remedy} drops the target, its state and quarantine."
    )
    # What a flow object's user runs; a pipeline names its own command instead.
    PYTHON_REMEDY = "flow.full_refresh(spark)"


class MaxStalenessUnsupportedError(EngineError):
    error_class = "AUTOCDC_MAX_STALENESS_UNSUPPORTED"
    template = (
        "Flow `{flow}` sets `max_staleness` together with {why}. Staged micro-batches are "
        "applied later as one batch, which is exact only for full-row upserts (a batch "
        "that leaves a column out of a partial upsert would read as setting it to NULL "
        "once batches are merged). Remove `max_staleness` from this flow (every "
        "micro-batch is then applied at once), or send full rows."
    )


class InvalidMaxStalenessError(EngineError):
    error_class = "AUTOCDC_INVALID_MAX_STALENESS"
    template = (
        "`{field}` = {value!r} is not {what}. Give an interval: a timedelta, a number of "
        "seconds, or text such as '10 minutes' or 'INTERVAL 1 HOUR' (at least 0 seconds); "
        "`max_staged_rows` takes a positive integer."
    )


class StateFormatError(EngineError):
    error_class = "AUTOCDC_STATE_FORMAT_CHANGED"
    template = (
        "The state table `{table}` was written in format {found} by an older autocdc; this "
        "one reads format {expected} (sequences only, no copy of the values). Rebuild the "
        "flow from its source with a full refresh (`autocdc run --full-refresh <dataset>`, "
        "or flow.full_refresh(spark)); the target stays readable until then."
    )


class RedoMissingError(EngineError):
    error_class = "AUTOCDC_REDO_MISSING"
    template = (
        "Batch {batch} of `{target}` committed to the target, but its redo (the state rows "
        "still to append) is not in {folder}: it was removed by hand while the writer was "
        "down. The state cannot be completed; rebuild the flow with a full refresh."
    )


class ConcurrentWriteError(EngineError):
    error_class = "AUTOCDC_CONCURRENT_WRITE"
    template = (
        "Another writer kept committing to `{table}` while this batch was being applied "
        "({attempts} attempts); nothing of this batch was lost or half-applied. Run one "
        "writer per target at a time, then apply the batch again."
    )


class SnapshotVersionNotNewerError(EngineError):
    error_class = "AUTOCDC_SNAPSHOT_VERSION_NOT_NEWER"
    template = (
        "Snapshot version {version} for `{target}` is not greater than the last version "
        "processed, {last}; nothing was written. Snapshots are applied once each, in "
        "ascending version order: give a version above {last} (a next_snapshot function "
        "receives it as latest_version), or start over with a full refresh."
    )


class SnapshotDuplicateKeyError(EngineError):
    error_class = "AUTOCDC_SNAPSHOT_DUPLICATE_KEY"
    template = (
        "Snapshot version {version} for `{target}` holds {rows} rows with key {key}; "
        "nothing was written. A snapshot holds one row per key: remove the duplicates in "
        "the source, or add the column that tells them apart to `keys`."
    )


class SnapshotNullKeyError(EngineError):
    error_class = "AUTOCDC_SNAPSHOT_NULL_KEY"
    template = (
        "Snapshot version {version} for `{target}` has a row whose key {key} is NULL in "
        "{columns}; nothing was written. A NULL key identifies no row: filter such rows "
        "out of the source or fill the key, then run again."
    )


class SnapshotMassDeleteError(EngineError):
    error_class = "AUTOCDC_SNAPSHOT_MASS_DELETE"
    template = (
        "Snapshot version {version} for `{target}` would delete {deletes} of its {rows} "
        "rows ({share}), more than max_delete_fraction={limit}; nothing was written. An "
        "empty or partial snapshot (a failed export, a permissions change) looks like this: "
        "check the source. If the deletes are expected, apply it with expect_deletes=True "
        "(`autocdc run --expect-deletes DATASET`, dp.run(expect_deletes=[...])), or "
        "raise the flow's max_delete_fraction (None turns the guard off)."
    )


class SnapshotInvalidVersionError(EngineError):
    error_class = "AUTOCDC_SNAPSHOT_INVALID_VERSION"
    template = (
        "The snapshot source of `{target}` gave {got}: expected a (DataFrame, version) "
        "pair with an integer version (64 bits), or None when there is no newer snapshot. "
        "Return e.g. (df, 20260131) for the snapshot of a day."
    )


class SnapshotSequenceError(EngineError):
    error_class = "AUTOCDC_SNAPSHOT_SEQUENCE"
    template = (
        "Snapshot flow `{flow}` into `{target}` cannot share the target's clock: {why}. {remedy}"
    )


class SnapshotPositionError(EngineError):
    error_class = "AUTOCDC_SNAPSHOT_POSITION"
    template = (
        "Snapshot version {version} for `{target}` has no single position: its "
        "sequence_by gives {found}; nothing was written. A snapshot is taken at one point "
        "of the change feed: give every row the same non-NULL value (the LSN, offset or "
        "time it was taken at), or a literal."
    )


class JarsUnresolvedError(EngineError):
    error_class = "AUTOCDC_JARS_UNRESOLVED"
    template = (
        "The session's jars ({coordinate}) could not be resolved (spark-submit exited with "
        "{code}); ivy's report is in {log}. Check that Java is installed and Maven Central "
        "(repo1.maven.org) is reachable, then run `python -m autocdc.engine.jars` again."
    )


class DeltaNotSubmittedError(EngineError):
    error_class = "AUTOCDC_DELTA_NOT_SUBMITTED"
    template = (
        "spark-submit started the JVM without Delta Lake's classes ({catalog} is not "
        "loadable), and autocdc cannot add jars to a JVM already running. Add "
        "`--packages {coordinate}` to the spark-submit command (or `--jars` with the "
        "files `python -m autocdc.engine.jars` put in {jar_dir})."
    )


# An autocdc error raised where the driver cannot keep the object (inside a Python worker:
# a source's reader, a UDF; or by a query's ``raise_error``) reaches the driver as text
# only, in the message of the exception Spark wraps it in (PythonException,
# StreamingQueryException). An error raised on the driver, in ``foreachBatch`` too, needs
# none of this: the runner keeps the object itself (``Runner.guarded``). The two shapes
# of that text: a worker's traceback names the class and its module ...
_IN_WORKER = re.compile(r"^(autocdc(?:\.\w+)+)\.(\w+): \[(AUTOCDC_\w+)\] (.*)$", re.MULTILINE)
# ... and Spark's report of a ``raise_error`` carries only the code.
_RAISED = re.compile(
    r"\[USER_RAISED_EXCEPTION\] \[(AUTOCDC_\w+)\] (.*?)(?: SQLSTATE: \w+)?$", re.MULTILINE
)


def raised_in_worker(error: BaseException) -> AutoCdcError | None:
    """The autocdc error that ``error``'s text carries, rebuilt on the driver: the class
    its code is registered to, its message as raised, and its params read back from the
    message by the class's template (each as the text the message shows); ``None`` when
    ``error`` carries none. The one place an error crossing into the driver as text
    gets its class back."""
    text = str(error)
    if found := _IN_WORKER.findall(text):
        module, _name, error_class, message = found[-1]
        importlib.import_module(module)  # its classes registered, as in the worker
    elif found := _RAISED.findall(text):
        error_class, message = found[-1]
    else:
        return None
    cls = _with_class(AutoCdcError, error_class)
    if cls is None:
        return None
    rebuilt = cls.__new__(cls)
    Exception.__init__(rebuilt, f"[{error_class}] {message}")
    rebuilt.params = _params(cls.template, message)
    return rebuilt


def _with_class(base: type[AutoCdcError], error_class: str) -> type[AutoCdcError] | None:
    """The subclass of ``base`` (imported so far) whose ``error_class`` is ``error_class``."""
    for cls in base.__subclasses__():
        if getattr(cls, "error_class", None) == error_class:
            return cls
        if (found := _with_class(cls, error_class)) is not None:
            return found
    return None


def _params(template: str, message: str) -> dict[str, Any]:
    """The params ``template`` rendered into ``message``, as the text it shows them as (a
    ``!r`` one evaluated back); empty when the message does not fit the template."""
    pattern, names, evaluated = "", set(), set()
    for literal, name, _spec, conversion in string.Formatter().parse(template):
        pattern += re.escape(literal)
        if name is not None:
            pattern += f"(?P={name})" if name in names else f"(?P<{name}>.*?)"
            names.add(name)
            if conversion == "r":
                evaluated.add(name)
    found = re.fullmatch(pattern, message, re.DOTALL)
    if found is None:
        return {}
    params: dict[str, Any] = found.groupdict()
    for name in evaluated:
        with contextlib.suppress(ValueError, SyntaxError):
            params[name] = ast.literal_eval(params[name])
    return params
