"""Errors of pipeline definitions: each names the dataset or flow and where it was defined.

They are raised before anything runs (``autocdc run`` and ``autocdc dry-run`` exit with
status 2 and write nothing). ``where`` is ``file:line`` as pyspark records it.
"""

from __future__ import annotations

from autocdc.runtime import AutoCdcError


class PipelineError(AutoCdcError):
    """An error of a pipeline (:mod:`autocdc.pipelines`): its spec, its definitions, a run,
    the operations on it."""


class PipelineDefinitionError(PipelineError):
    """A library file could not be loaded, or a definition in it was refused."""

    error_class = "AUTOCDC_PIPELINE_DEFINITION"
    template = "{where}: {problem}. {hint}"


class DuplicateDatasetError(PipelineError):
    error_class = "AUTOCDC_PIPELINE_DUPLICATE_DATASET"
    template = (
        "{where}: dataset `{name}` is already defined at {first}. Give one of them another "
        "name, or feed both into one streaming table with append flows."
    )


class DuplicateFlowError(PipelineError):
    error_class = "AUTOCDC_PIPELINE_DUPLICATE_FLOW"
    template = "{where}: flow `{name}` is already defined at {first}. Give it another name."


class UndefinedTargetError(PipelineError):
    error_class = "AUTOCDC_PIPELINE_UNDEFINED_TARGET"
    template = (
        "{where}: flow `{flow}` writes into `{target}`, which the pipeline does not define. "
        "Define it first, e.g. dp.create_streaming_table('{target}') or CREATE STREAMING "
        "TABLE {target}."
    )


class NotAStreamingTableError(PipelineError):
    error_class = "AUTOCDC_PIPELINE_TARGET_NOT_STREAMING_TABLE"
    template = (
        "{where}: flow `{flow}` writes into `{target}`, a {kind}. {what} write only into "
        "streaming tables: declare `{target}` with create_streaming_table / CREATE "
        "STREAMING TABLE."
    )


class FlowsDisagreeError(PipelineError):
    error_class = "AUTOCDC_PIPELINE_FLOWS_DISAGREE"
    template = (
        "{where}: AUTO CDC flow `{flow}` writes into `{target}` with {field}={value}, but "
        "flow `{other}` ({first}) writes into it with {field}={other_value}. Flows into one "
        "target share its state: give them the same {field}, or write into separate targets."
    )


class SnapshotTargetSharedError(PipelineError):
    error_class = "AUTOCDC_PIPELINE_SNAPSHOT_TARGET_SHARED"
    template = (
        "{where}: AUTO CDC FROM SNAPSHOT flow `{flow}` writes into `{target}`, and so does "
        "flow `{other}` ({first}). A snapshot flow makes its target equal to each snapshot "
        "(keys missing from it are deleted): it shares its target only with AUTO CDC "
        "flows, and only with `sequence_by` (SQL: SEQUENCE BY), its position on their "
        "clock. Declare that, or write the other flow into another table."
    )


class BatchQueryForStreamingTableError(PipelineError):
    error_class = "AUTOCDC_PIPELINE_BATCH_QUERY_FOR_STREAMING_TABLE"
    template = (
        "{where}: flow `{flow}` into streaming table `{target}` returns a batch query. Read "
        "the source with spark.readStream (or STREAM(...) in SQL), or make `{target}` a "
        "materialized view."
    )


class CycleError(PipelineError):
    error_class = "AUTOCDC_PIPELINE_CYCLE"
    template = (
        "The datasets {cycle} read each other in a cycle (first at {where}). A pipeline "
        "must be a DAG: break the cycle."
    )


class DatasetNotFoundError(PipelineError):
    error_class = "AUTOCDC_PIPELINE_DATASET_NOT_FOUND"
    template = (
        "{where}: flow `{flow}` reads `{name}`, which is neither a dataset of the pipeline "
        "nor a table of the warehouse. Fix the name or define the dataset."
    )


class FlowAnalysisError(PipelineError):
    error_class = "AUTOCDC_PIPELINE_FLOW_INVALID"
    template = "{where}: flow `{flow}` cannot run: {problem}"


class UnknownDatasetError(PipelineError):
    error_class = "AUTOCDC_PIPELINE_UNKNOWN_DATASET"
    template = (
        "--refresh / --full-refresh / --expect-deletes name(s) {names}, not datasets of the "
        "pipeline ({known})."
    )


class PipelineLockedError(PipelineError):
    """Another run of the pipeline holds its storage folder (``execute.lock``)."""

    error_class = "AUTOCDC_PIPELINE_LOCKED"
    template = (
        "Pipeline `{pipeline}` is already running: host {host}, pid {pid}, since {since} "
        "({ago} ago), holding {path}. Wait for that run to end, or stop it. If it died, its "
        "claim expires {expiry:g} s after its last heartbeat ({heartbeat_ago} ago), and at "
        "once on its own host when its process is gone; then run again."
    )


class PipelineLockLostError(PipelineError):
    """The running pipeline's lease went to another run: it stops rather than write beside it."""

    error_class = "AUTOCDC_PIPELINE_LOCK_LOST"
    template = (
        "The run of pipeline `{pipeline}` lost its lock {path}: {why}. It stopped so as not "
        "to write beside another run. A run whose heartbeat stalls for {expiry:g} s "
        "(autocdc.lock.expirySeconds) can be taken over: check what stalled it, then run "
        "again."
    )


class UnknownFlowError(PipelineError):
    error_class = "AUTOCDC_PIPELINE_UNKNOWN_FLOW"
    template = (
        "The event log of pipeline `{pipeline}` has no batch of flow `{flow}`, nor of one "
        "flow into a target of that name (flows with batches: {known}). Check the name, or "
        "run the pipeline first."
    )


class CheckpointElsewhereError(PipelineError):
    """A flow's checkpoint was written for files at another place (see
    :func:`autocdc.pipelines.execute.position.elsewhere`): Spark would fail on it, or worse."""

    error_class = "AUTOCDC_PIPELINE_CHECKPOINT_ELSEWHERE"
    template = (
        "Flow `{flow}`: its checkpoint records the files it read under {recorded}, but its "
        "source is now {location}: the source's path changed (a project moved whole goes "
        "on by itself; this source did not move with it). Spark's checkpoints keep "
        "absolute paths, so the flow cannot go on from this one. Put the source back, or "
        "start the flow over from its source here: `autocdc run --full-refresh {dataset}` "
        "(its target is rebuilt from every file the source holds)."
    )


class CheckpointNotEmptyError(PipelineError):
    """Spark refused to start a flow's query at its first micro-batch because its
    checkpoint is not empty, and the runner could not tell it safe to clear (see
    :mod:`autocdc.pipelines.execute.unstarted`)."""

    error_class = "AUTOCDC_PIPELINE_CHECKPOINT_NOT_EMPTY"
    template = (
        "Flow `{flow}`: Spark will not start its first micro-batch, because its checkpoint "
        "{checkpoint} holds files of another start ({found}). autocdc clears what a killed "
        "first micro-batch leaves; these it did not recognise. If no other query writes "
        "there, move the folder aside and run again (the flow starts from its source's "
        "beginning; the target absorbs changes it already has), or rebuild the target: "
        "`autocdc run --full-refresh {dataset}`."
    )


class FlowRetriesExhaustedError(PipelineError):
    """A flow failed on an error that is not autocdc's own more times in a row than the
    run retries it (:mod:`autocdc.pipelines.execute.retries`)."""

    error_class = "AUTOCDC_PIPELINE_FLOW_FAILED"
    template = (
        "Flow `{flow}` (into `{target}`) failed {failures} times in a row, the last time "
        "with {cause}. Its checkpoint keeps every batch it applied: fix the cause and run "
        "again, and it goes on from there. More attempts: set "
        "`spark.sql.pipelines.maxFlowRetryAttempts` (now {attempts}) in the spec's "
        "configuration."
    )


class FreshReadAmbiguousError(PipelineError):
    """Several flows into one target stage their changes: each merges only its own into a
    fresh read (:mod:`autocdc.pipelines.operations.fresh`), so none answers for all."""

    error_class = "AUTOCDC_PIPELINE_FRESH_READ_AMBIGUOUS"
    template = (
        "Dataset `{dataset}`: its flows {flows} each stage changes (max_staleness), and a "
        "fresh read merges one flow's. Apply what they staged first (`autocdc apply "
        "{dataset}`), then read the table itself."
    )


class NoSuchDatasetError(PipelineError):
    error_class = "AUTOCDC_PIPELINE_NO_SUCH_DATASET"
    template = "Pipeline `{pipeline}` has no dataset `{name}`; its datasets: {known}."


class TargetNotCreatedError(PipelineError):
    error_class = "AUTOCDC_PIPELINE_TARGET_NOT_CREATED"
    template = (
        "Dataset `{dataset}` has no table yet: its flows have applied nothing. Run pipeline "
        "`{pipeline}` first (`autocdc run`), then read it."
    )


class SourceDataLostError(PipelineError):
    """Spark's Kafka source found offsets in the checkpoint that the broker does not have:
    see :func:`autocdc.pipelines.execute.runner.data_lost`."""

    error_class = "AUTOCDC_PIPELINE_SOURCE_DATA_LOST"
    template = (
        "Flow `{flow}`: its checkpoint holds Kafka offsets the broker no longer has, so "
        'Spark stopped it ("Some data may have been lost"): the broker or topic is a new '
        "one (deleted and created again, or new servers, as each start of an example's) or "
        "retention removed records it had not read. To read the topic again from its start "
        "into a rebuilt target: `autocdc run --full-refresh {dataset}`."
    )


class ReplayPositionError(PipelineError):
    """A ``--replay-from`` that cannot be read, or a position of a kind the flow's source
    does not have (see :mod:`autocdc.pipelines.execute.replay`)."""

    error_class = "AUTOCDC_PIPELINE_REPLAY_POSITION"
    template = (
        "--replay-from {given!r}: {problem}. Give FLOW=KIND:VALUE, e.g. "
        "orders=version:12, orders=timestamp:2026-01-31T08:00:00Z, "
        'orders=offsets:{{"topic":{{"0":42}}}}, orders=offsets:earliest, '
        'orders=lsn:16/B374D848 or orders=watermark:{{"updated_at":"2026-01-31 08:00:00"}}.'
    )


class ReplayUnknownFlowError(PipelineError):
    error_class = "AUTOCDC_PIPELINE_REPLAY_UNKNOWN_FLOW"
    template = (
        "--replay-from names flow `{flow}`, which the pipeline does not define (its flows: "
        "{known}). A flow's name is its `name=`, else its target's."
    )


class ReplayUnsupportedError(PipelineError):
    """The flow cannot be rewound: nothing was written."""

    error_class = "AUTOCDC_PIPELINE_REPLAY_UNSUPPORTED"
    template = (
        "Flow `{flow}` cannot be replayed: {why}. Replay rewinds an AUTO CDC flow that "
        "streams one Delta table (positions version: and timestamp:, and lsn: in a "
        "PostgreSQL capture's change table) or one Kafka source (offsets: and timestamp:), "
        "or one reading a WATERMARK extraction source (watermark:). "
        "To read everything again instead: "
        "`autocdc run --full-refresh {dataset}`."
    )


class ReplayNotStartedError(PipelineError):
    error_class = "AUTOCDC_PIPELINE_REPLAY_NOT_STARTED"
    template = (
        "Flow `{flow}` has no committed micro-batch to rewind from{why}. Run the pipeline "
        "without --replay-from: a flow's first run reads its whole source."
    )


class ReplayBeyondRetentionError(PipelineError):
    """The source no longer holds the changes from the position asked: nothing was written."""

    error_class = "AUTOCDC_PIPELINE_REPLAY_BEYOND_RETENTION"
    template = (
        "Flow `{flow}` cannot replay from {position}: its source {source} no longer holds "
        "the changes from there ({why}). The oldest position it still holds: {oldest}. "
        "Replay from there or later, or rebuild the target from what the source holds: "
        "`autocdc run --full-refresh {dataset}`."
    )


class PipelineStepError(PipelineError):
    """A step of a run (load, resolve, run, apply) failed on an error that is not autocdc's
    (Spark's, the user's code): kept as the cause, see
    :mod:`autocdc.pipelines.execute.pipeline`."""

    error_class = "AUTOCDC_PIPELINE_STEP_FAILED"
    template = (
        "Pipeline `{pipeline}`: its {step} step failed: {error}. Its cause, chained to this "
        "error, has the details (the CLI writes them to the log file)."
    )
