"""The run of a flow whose source is an extraction: lease, read, apply, then checkpoint.

Not a Spark streaming source: a CUSTOM cursor's checkpoint is known only once its rows
are read, which Spark's offsets (planned before the read) cannot express. The runner
calls :meth:`Step.run` instead, with the flow's ``apply`` (``AutoCdcFlow.apply``, or any
flow that takes a batch DataFrame):

1. take the source's lease (``<storage>/extractions/<source>.lock``, a
   :mod:`autocdc.pipelines.execute.lock` lease): one run per source at a time, a second one is
   refused, and the lease of a run that died is taken over by the next;
2. read the flow's checkpoint (:mod:`autocdc.pipelines.execute.checkpoint`), look up the
   newest values in scope (the lag's measure: when that lookup fails for good, the lag is
   unknown and the run goes on) and plan the run's batches from the checkpoint
   (:func:`extract.plan`), bounded by a ``limit``'s edge (looked up first,
   :func:`pgextract.edge`: the batches depend on it, so its failure fails the run); take
   the read's sequence, above every read of the flow before
   (:meth:`CheckpointFile.next_read`);
3. read the batches, up to ``max_concurrency`` at once; a batch that fails for good fails
   the run. How is the source's :class:`Reads`: a ``dsn`` source's :class:`Libpq` reads
   each batch in the driver's threads into a fresh sink per attempt (memory, or staged
   files), a ``url`` source's :class:`Jdbc` makes every batch a partition of one Spark
   read, staged, read again whole after a failure;
4. merge the batches' accumulators into the next checkpoint, in plan order, and check
   that it can be stored, before anything is written;
5. apply every row read, as one batch, with the read's sequence (a later read of a row
   sees a state at least as new: :func:`autocdc.pipelines.execute.graph.place` orders the
   changes by it after the flow's own ``sequence_by``);
6. only then replace the checkpoint (unless the run read no row: it is kept), and note
   the run's end and how far the checkpoint is behind the newest values the source held
   when the run began (``autocdc status``'s lag);
7. sweep the staged files and release the lease, also when the run failed.

Every query of steps 2 and 3, through libpq or JDBC, follows one rule (:class:`Retry`): a
failure (a statement timeout on a busy database, a lost connection) is sent again after a
growing pause, up to ``retries`` times; after that, the lag stays unknown or the run
fails with :class:`BatchFailedError` and the database's words.

Why a kill or a failure anywhere is harmless: the checkpoint moves only after the target
committed the rows read past it. Until then the previous checkpoint stands, and the next
run reads from it again: every row the interrupted run read is read again (or its newer
state is), and the changes the engine already applied are no-ops, since a target depends
only on the set of changes (docs/semantics.md). Delivery is at least once, exactly as the
engine absorbs it.
"""

from __future__ import annotations

import functools
import json
import shutil
import time
from collections.abc import Callable
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from autocdc.engine import ColumnOrSql, crash_point, ident, to_column
from autocdc.pipelines.execute import lock
from autocdc.pipelines.execute.checkpoint import CheckpointFile
from autocdc.runtime import AutoCdcError
from autocdc.sources import extract, jdbcextract, pgextract, staging
from autocdc.sources.errors import BatchFailedError, PlanFailedError, SourceLockedError

T = TypeVar("T")
STAGING = "extraction-staging"  # in the flow's checkpoint folder
LEASES = "extractions"  # in the pipeline's storage folder
MAX_BACKOFF_SECONDS = 5.0
SAID = 200  # characters of a checkpoint in the run's output
READ_FIELD = "__autocdc_read"  # the read's time, in an extraction flow's sequence


def frame(spark: SparkSession, source: extract.Extraction) -> DataFrame:
    """The source's typed columns and no rows: what a flow's definition is checked with."""
    if source.url is not None:
        table: pgextract.Table | jdbcextract.Table = jdbcextract.describe(spark, source)
    else:
        table = pgextract.describe(source)
    return staging.frame(spark, [], table.schema(source.columns))


def sequence(sequence_by: ColumnOrSql | list[str] | None, read: int) -> Column:
    """What orders an extraction flow's changes: the flow's ``sequence_by``, then the read
    (``read``: :meth:`CheckpointFile.next_read`). The source knows more than a column does:
    a later read of a row sees a state at least as new, so two reads at one
    ``sequence_by`` value (a coarse clock, two writes in one tick) are settled by the order
    of the reads, not by the greater row. Without ``sequence_by``, the read alone (its
    time: an SCD type 2 version starts when the read saw it)."""
    at = F.timestamp_micros(F.lit(read)).alias(READ_FIELD)
    if sequence_by is None:
        return at
    if isinstance(sequence_by, list):
        return F.struct(*[F.col(ident(c)).alias(c) for c in sequence_by], at)
    return F.struct(to_column(sequence_by), at)


def _quiet(message: str) -> None:
    """Where a step's lines go by default: nowhere (the runner prints them)."""


def _words(error: BaseException) -> str:
    """What a failed libpq query said: psycopg's error carries the database's words."""
    return f"{type(error).__name__}: {str(error).strip()}"


class LagUnknownError(Exception):
    """The newest values could not be looked up: the lag of this run is unknown."""

    def __init__(self, words: str, attempts: int) -> None:
        super().__init__(f"{words} ({attempts} attempts)")


@dataclass(frozen=True)
class Retry:
    """The rule every query of a run follows, through libpq or JDBC alike: one that fails
    (a statement timeout, a lost connection) is sent again after a growing pause, up to
    ``retries`` times; then ``failed`` says what the run makes of it. An
    :class:`AutoCdcError` is no failure of the database (a declaration refused, a
    checkpoint that cannot be stored) and is raised at once."""

    source: str
    retries: int
    say: Callable[[str], None] = _quiet
    gist: Callable[[BaseException], str] = _words  # the database's words in an error

    def __call__(
        self,
        query: Callable[[int], T],
        what: str,
        failed: Callable[[str, int], Exception],
    ) -> T:
        """``query(attempt)``'s result, from attempt 1 on; ``query`` cleans up after
        itself. ``failed(words, attempts)`` is raised from the last attempt's error."""
        attempts, attempt = 1 + self.retries, 1
        while True:
            try:
                return query(attempt)
            except AutoCdcError:
                raise
            except Exception as error:
                words = self.gist(error)
                if attempt == attempts:
                    raise failed(words, attempts) from error
                self.say(f"extraction {self.source}: {what} failed ({words}); trying again "
                         f"({attempt + 1} of {attempts})")  # fmt: skip
                time.sleep(min(0.25 * 2 ** (attempt - 1), MAX_BACKOFF_SECONDS))
            attempt += 1


@dataclass(frozen=True)
class Read:
    """What one batch left: its accumulator, its rows for the load, and their count."""

    acc: Any
    part: staging.Part
    rows: int


@dataclass(frozen=True)
class Extracted(Generic[T]):
    """A run's outcome: what ``apply`` returned, and what was read."""

    result: T
    rows: int
    batches: int
    checkpoint: Any  # the flow's checkpoint after the run (None: STATELESS, or none yet)
    advanced: bool
    lag_unknown: str | None = None  # why the newest values could not be looked up

    def position(self, source: str) -> dict[str, Any]:
        """The run's entry of the event log's ``source_position``."""
        offset = json.loads(extract.dumps(self.checkpoint))  # a Decimal as extract keeps it
        entry = {"kind": "extraction", "path": None, "source": source, "offset": offset}
        return {**entry, "lag_unknown": self.lag_unknown}


@dataclass(frozen=True)
class Step:
    """One flow reading one extraction source."""

    source: extract.Extraction
    flow: str
    dataset: str  # what `--full-refresh` names to start the flow over
    checkpoints: Path  # the flow's checkpoint folder
    storage: Path  # the pipeline's storage folder (the source's lease lives there)
    pipeline: str
    expiry: float = lock.DEFAULT_EXPIRY_SECONDS
    say: Callable[[str], None] = _quiet

    def run(
        self,
        spark: SparkSession,
        options: extract.ExtractionOptions,
        apply: Callable[[DataFrame, int], T],
    ) -> Extracted[T]:
        refused = functools.partial(SourceLockedError, source=self.source.name)
        leases = self.storage / LEASES
        name = f"{self.source.name}.lock"
        with lock.hold(leases, self.pipeline, self.expiry, name=name, refused=refused):
            staged = self.checkpoints / STAGING
            shutil.rmtree(staged, ignore_errors=True)  # what a killed run left
            try:
                return self._run(spark, options, apply, staged)
            finally:
                shutil.rmtree(staged, ignore_errors=True)

    def _run(
        self,
        spark: SparkSession,
        options: extract.ExtractionOptions,
        apply: Callable[[DataFrame, int], T],
        staged: Path,
    ) -> Extracted[T]:
        source = self.source
        store = CheckpointFile(self.checkpoints)
        stored = store.read(source, self.flow, self.dataset)
        cursor = source.run_cursor()
        reads: Reads = (
            Jdbc(spark, source, staged) if source.url is not None else Libpq(spark, source, staged)
        )
        retry = Retry(source.name, options.retries, self.say, reads.gist)
        newest, unknown = None, None
        try:  # what it can reach: the lag's measure, which the read does not need
            newest = retry(
                lambda _: reads.newest(), "the lookup of the newest values", LagUnknownError
            )
        except LagUnknownError as error:
            unknown = str(error)
        limit, bound = source.run_limit(), None
        if limit is not None:
            beyond = limit.beyond(stored).narrowed(source.where).where
            at = retry(
                lambda _: reads.edge(limit, stored),
                "the lookup of the limit's edge",
                lambda words, attempts: PlanFailedError(
                    query="lookup of the `limit`'s edge",
                    source=source.name,
                    where=beyond,
                    attempts=attempts,
                    error=words,
                ),
            )
            bound = limit.within(stored, at)
        batches = extract.plan(source, cursor, stored, bound)
        read = store.next_read()
        got, acc, rows = reads.load(batches, cursor, stored, options, retry)
        checkpoint = None
        if source.keeps_checkpoint:
            checkpoint = acc if rows else stored
            extract.dumps(checkpoint, source.name)  # refused now, before anything is written
        result = apply(got, read)
        advanced = source.keeps_checkpoint and rows > 0 and checkpoint != stored
        if advanced:
            store.write(source, checkpoint, rows, len(batches))
        gaps = None if newest is None else extract.behind(source.cdc_order, checkpoint, newest)
        record = {"rows": rows, "checkpoint": checkpoint, "newest": newest, "behind": gaps}
        store.finished(source, {**record, "lag_unknown": unknown})
        said = f"flow {self.flow}: extraction {source.name} read {rows} rows"
        said += f" in {len(batches)} batches"
        if source.keeps_checkpoint:
            text = extract.dumps(checkpoint)
            said += f"; checkpoint {text if len(text) <= SAID else text[:SAID] + '...'}"
        if unknown is not None:
            said += f"; lag unknown (the newest values could not be looked up: {unknown})"
        self.say(said)
        return Extracted(result, rows, len(batches), checkpoint, advanced, unknown)


class Reads(Protocol):
    """One run's queries of a source, whichever way it reads: the lookups it plans with
    and the read of its batches, each attempt run by the step's :class:`Retry` (which
    quotes the database through ``gist``)."""

    gist: Callable[[BaseException], str]

    def newest(self) -> dict[str, Any]:
        """Per ``cdc_order`` column, the newest value in scope (the lag's measure)."""
        ...

    def edge(self, limit: extract.Limit, checkpoint: Any) -> Any:
        """Where a run with ``limit`` stops."""
        ...

    def load(
        self,
        batches: list[extract.Batch],
        cursor: extract.Cursor,
        checkpoint: Any,
        options: extract.ExtractionOptions,
        retry: Retry,
    ) -> tuple[DataFrame, Any, int]:
        """The rows read (typed as the flow reads them), their accumulator, their count."""
        ...


class Libpq:
    """One run's reads of a ``dsn`` source (:mod:`autocdc.sources.pgextract`): the batches
    read in the driver's threads, each retried on its own (:class:`Reader`)."""

    gist = staticmethod(_words)  # psycopg's error carries the database's words

    def __init__(self, spark: SparkSession, source: extract.Extraction, staged: Path) -> None:
        self.spark, self.source, self.staged = spark, source, staged
        self.table = pgextract.describe(source)

    def newest(self) -> dict[str, Any]:
        return pgextract.newest(self.source, self.table)

    def edge(self, limit: extract.Limit, checkpoint: Any) -> Any:
        return pgextract.edge(self.source, self.table, limit, checkpoint)

    def load(
        self,
        batches: list[extract.Batch],
        cursor: extract.Cursor,
        checkpoint: Any,
        options: extract.ExtractionOptions,
        retry: Retry,
    ) -> tuple[DataFrame, Any, int]:
        reader = Reader(self.source, self.table, cursor, checkpoint, options, self.staged, retry)
        reads = reader.read_all(batches)
        rows = sum(r.rows for r in reads)
        acc = extract.advance(cursor, [r.acc for r in reads]) if rows else None
        schema = self.table.schema(self.source.columns)
        return staging.frame(self.spark, [r.part for r in reads], schema), acc, rows


class Jdbc:
    """One run's reads of a ``url`` source (:mod:`autocdc.sources.jdbcextract`): every
    batch a partition of one Spark read (at most ``max_concurrency`` queries at once),
    staged once, read again as a whole after a failure up to ``retries`` times."""

    gist = staticmethod(jdbcextract.gist)  # Spark wraps the database's words

    def __init__(self, spark: SparkSession, source: extract.Extraction, staged: Path) -> None:
        self.spark, self.source, self.staged = spark, source, staged
        self.table = jdbcextract.describe(spark, source)

    def newest(self) -> dict[str, Any]:
        with jdbcextract.jvm_zone(self.spark):
            return jdbcextract.newest(self.spark, self.source, self.table)

    def edge(self, limit: extract.Limit, checkpoint: Any) -> Any:
        with jdbcextract.jvm_zone(self.spark):
            return jdbcextract.edge(self.spark, self.source, self.table, limit, checkpoint)

    def load(
        self,
        batches: list[extract.Batch],
        cursor: extract.Cursor,
        checkpoint: Any,
        options: extract.ExtractionOptions,
        retry: Retry,
    ) -> tuple[DataFrame, Any, int]:
        """The rows read (typed as the flow reads them), their accumulator, their count."""
        most = options.max_concurrency

        def attempt(number: int) -> tuple[DataFrame, Any, int]:
            path = self.staged / f"jdbc-attempt-{number}"
            try:
                with jdbcextract.jvm_zone(self.spark):  # the checkpoint's text: the database's
                    rows = jdbcextract.read(
                        self.spark, self.source, self.table, batches, path, most
                    )
                    crash_point("extract_mid_read")  # staged, not applied
                    count = rows.count()
                    folding = count and self.source.keeps_checkpoint  # STATELESS keeps none
                    acc = jdbcextract.accumulator(cursor, checkpoint, rows) if folding else None
                return jdbcextract.typed(rows, self.source.columns), acc, count
            except BaseException:
                shutil.rmtree(path, ignore_errors=True)
                raise

        def failed(words: str, attempts: int) -> BatchFailedError:
            return BatchFailedError(
                source=self.source.name,
                batch=f"1-{len(batches)}" if len(batches) > 1 else 1,
                batches=len(batches),
                where=" | ".join(b.where for b in batches),
                attempts=attempts,
                error=words,
            )

        return retry(attempt, "the read", failed)


@dataclass(frozen=True)
class Reader:
    """One run's reads of its batches, from one checkpoint."""

    source: extract.Extraction
    table: pgextract.Table
    cursor: extract.Cursor
    checkpoint: Any
    options: extract.ExtractionOptions
    staged: Path  # the staged files' folder
    retry: Retry | None = None  # the step's (one rule for every query); else a quiet one

    def read_all(self, batches: list[extract.Batch]) -> list[Read]:
        """Every batch, up to ``max_concurrency`` at once; the reads in plan order, so the
        checkpoint merged from them never depends on the order they completed in. The
        first batch that fails for good fails the run: batches not started are cancelled,
        the ones running end first."""
        pool = ThreadPoolExecutor(
            self.options.max_concurrency or 1, thread_name_prefix="autocdc-extract"
        )
        try:
            futures: list[Future[Read]] = [
                pool.submit(self._read, i, batches) for i in range(len(batches))
            ]
            wait(futures, return_when=FIRST_EXCEPTION)
            for future in futures:
                if future.done() and future.exception() is not None:
                    raise future.exception()  # type: ignore[misc]
            return [future.result() for future in futures]
        finally:
            pool.shutdown(wait=True, cancel_futures=True)

    def _read(self, index: int, batches: list[extract.Batch]) -> Read:
        """One batch, each attempt into a fresh sink, by the run's :class:`Retry`; then
        :class:`BatchFailedError`."""
        batch = batches[index]

        def attempt(number: int) -> Read:
            if self.options.staging:
                path = self.staged / f"batch-{index}-attempt-{number}.parquet"
                sink: staging.MemorySink | staging.StagedSink = staging.StagedSink(path)
            else:
                sink = staging.MemorySink()
            try:
                acc, rows = pgextract.read_batch(
                    self.source,
                    self.table,
                    batch,
                    self.cursor,
                    self.checkpoint,
                    sink,
                    self.options.page_rows,
                )
                return Read(acc, sink.close(), rows)
            except BaseException:
                sink.discard()
                raise

        def failed(words: str, attempts: int) -> BatchFailedError:
            return BatchFailedError(
                source=self.source.name,
                batch=index + 1,
                batches=len(batches),
                where=batch.where,
                attempts=attempts,
                error=words,
            )

        retry = self.retry or Retry(self.source.name, self.options.retries)
        return retry(attempt, f"batch {index + 1} of {len(batches)}", failed)
