"""The commit protocol: the target's commit is the batch's commit point.

A batch writes three tables (target, state, quarantine) and no transaction covers them
all. The protocol makes one of them, the target, decide, and writes the state once:

1. **Redo.** The batch's state rows and quarantine rows are written to a redo folder of
   their own, ``<warehouse>/<target>__autocdc_redo/<batch>-<token>/``. Nothing reads it
   unless step 2 committed.
2. **Target commit.** The target MERGE (or an append: of an initial load's rows into an
   empty target, or of nothing when the target does not change) commits with Delta's
   idempotent-write pair ``(txnAppId, txnVersion) = (autocdc/<target>, batch)`` and the
   token in its ``userMetadata``. Batch ids are the target's committed version plus one,
   so Delta itself refuses every stale writer: a write whose version is not above the
   committed one is skipped (we see an empty result and start over), and two writers
   committing at once conflict (``ConcurrentTransactionException``).
3. **Quarantine.** The redo's quarantine rows (rare: bad input) are appended to the
   quarantine table with the same ``(app, batch)``, so a repeat is skipped by Delta.

The redo's state rows are then the state's *pending* change: readers take the state
table together with the redo folders of the committed batches it does not hold yet
(:class:`Stored`). Every few batches (``FOLD_EVERY``, or once the pending rows pass
``FOLD_BYTES``) and before a compaction, the pending folders are **folded** into the
state table in one append whose ``txnVersion`` is the newest batch folded; a fold's
folders are removed by the next fold (a reader that listed them before this fold still
finds them). So a batch makes one durable file write and one Delta commit (the
target's), and the state table keeps its version, and Delta its snapshot, between folds.

Every batch starts with :func:`catch_up`: the committed batches above the state table's
``txnVersion`` are pending; each has exactly one redo folder that counts, the one whose
token the target's commit names (several exist only where writers raced: the losers'
are removed), and its quarantine rows are appended if a crash skipped step 3. A redo
whose target commit never happened (a crash before step 2, or a writer that lost) is
never read. A crash anywhere therefore leaves either the old batch (redo ignored) or the
new one (redo pending), never a mix, and a replay of the same changes afterwards is
judged against the state that includes them. A fold is maintenance: a crash or a
conflict in it leaves the folders pending, and Delta skips an append it already holds.

Delta's idempotent DML reads the pair from the session (``spark.databricks.delta.write.
txnAppId`` / ``txnVersion``); a per-session lock keeps two threads of one session from
mixing them. Streaming queries run their batches in sessions of their own.
"""

from __future__ import annotations

import shutil
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from py4j.protocol import Py4JJavaError
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from autocdc.engine import tables, tuning
from autocdc.engine.errors import RedoMissingError
from autocdc.engine.faults import crash_point
from autocdc.engine.tables import CONFLICTS, LostRace

REDO_SUFFIX = "__autocdc_redo"
_TXN_APP = "spark.databricks.delta.write.txnAppId"
_TXN_VERSION = "spark.databricks.delta.write.txnVersion"
_USER_METADATA = "spark.databricks.delta.commitInfo.userMetadata"
# A fold of the pending state rows into the state table: after this many batches, or
# once their redo files take this many bytes (a batch reads them all, without Delta's
# statistics), whichever comes first.
FOLD_EVERY = 8
FOLD_BYTES = 8 << 20
_HISTORY = 100  # target commits searched for a raced batch's token
_locks: dict[int, threading.Lock] = {}
_locks_guard = threading.Lock()


@dataclass(frozen=True)
class Tables:
    """The tables of one flow, and the app id its commits carry."""

    target: str
    state: str
    quarantine: str

    @property
    def app_id(self) -> str:
        return f"autocdc/{self.target}"

    def redo_root(self, spark: SparkSession) -> Path:
        return Path(tables.default_location(spark, self.target + REDO_SUFFIX))


@dataclass(frozen=True)
class Redo:
    """One batch's redo folder."""

    folder: Path
    batch: int

    @property
    def state(self) -> Path:
        return self.folder / "state"

    @property
    def quarantine(self) -> Path:
        return self.folder / "quarantine"

    @property
    def token(self) -> str:
        return self.folder.name.partition("-")[2]


def _snapshot(spark: SparkSession, name: str):
    """The latest snapshot of table ``name`` in the JVM's Delta log (cached by Delta)."""
    jvm = spark._jvm
    none = jvm.scala.Option.empty()
    log = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(
        spark._jsparkSession, tables.default_location(spark, name)
    )
    return log.update(False, none, none)


_warming_sessions: dict[int, SparkSession] = {}


def _warming_session(spark: SparkSession) -> SparkSession:
    """A session of ``spark``'s context for the warm-up, one per context (a streaming
    query's batches come in sessions of their own): its own SQL settings (interpreted
    expressions; see ``warming``) whatever the batch's are meanwhile."""
    key = id(spark.sparkContext)  # not reused: the session kept holds its context
    with _locks_guard:
        if key not in _warming_sessions:
            session = spark.newSession()
            session.conf.set(tuning.FACTORY_MODE, tuning.INTERPRETED)
            _warming_sessions[key] = session
        return _warming_sessions[key]


@contextmanager
def warming(spark: SparkSession, names: list[str]) -> Iterator[None]:
    """Tables ``names``' snapshots rebuilt in a background thread while the block runs.

    Delta rebuilds a table's snapshot state (its file list: a Spark job and the driver's
    time to plan it, most of a second) the first time a new version is read, and a batch reads
    two tables that the batch before it committed: the state (the plan) and the target
    (the MERGE). Rebuilt beside the stage and the plan, which leave a core idle while
    the driver plans, a batch's own reads find them ready (large and small batches
    alike take a few percent less time, paired). The rebuild runs in a session of its
    own, interpreted: a batch into a large table switches its own session to compiled
    expressions meanwhile (``tuning.fit_to_size``), under which a rebuild takes about
    twice as long. Delta keeps a table's snapshot per path, whichever
    session rebuilt it. The thread ends before the block does; a failure here is left
    to the batch's own read of that table to report."""
    session = _warming_session(spark)

    def warm() -> None:
        # Delta plans the rebuild in the thread's active session (its JVM thread's: PySpark
        # pins one to each Python thread), cleared after, for whatever runs there next.
        sessions = spark._jvm.org.apache.spark.sql.SparkSession
        sessions.setActiveSession(session._jsparkSession)
        try:
            for name in names:
                _snapshot(session, name).numOfFiles()
        except Exception:  # the batch's own read meets it, and says what it is
            pass
        finally:
            sessions.clearActiveSession()

    thread = threading.Thread(target=warm, name="autocdc-warm", daemon=True)
    thread.start()
    try:
        yield
    finally:
        thread.join()


def table_version(spark: SparkSession, name: str) -> int:
    """Table ``name``'s current Delta version (a listing of its log; no Spark job)."""
    return int(_snapshot(spark, name).version())


def holds_no_files(spark: SparkSession, name: str) -> bool:
    """Whether table ``name`` holds no data file (one small job: Delta's snapshot state)."""
    return int(_snapshot(spark, name).numOfFiles()) == 0


def committed_version(spark: SparkSession, name: str, app_id: str) -> int:
    """The last ``txnVersion`` of ``app_id`` committed to table ``name`` (0: none).

    Read from the Delta log's snapshot: no Spark job while the table is unchanged since
    the last look, one small one (Delta's state reconstruction) after a commit."""
    if not tables.exists(spark, name):
        return 0
    found = _snapshot(spark, name).transactions().get(app_id)
    return int(found.get()) if found.isDefined() else 0


@contextmanager
def _transaction(spark: SparkSession, app_id: str, version: int, token: str):
    """Delta's idempotent-DML settings for one write, under the session's lock."""
    key = id(spark._jsparkSession)
    with _locks_guard:
        lock = _locks.setdefault(key, threading.Lock())
    with lock:
        settings = {_TXN_APP: app_id, _TXN_VERSION: str(version), _USER_METADATA: token}
        for k, v in settings.items():
            spark.conf.set(k, v)
        try:
            yield
        finally:
            for k in settings:
                spark.conf.unset(k)


def write_redo(
    spark: SparkSession,
    names: Tables,
    batch: int,
    state_rows: DataFrame,
    quarantine_rows: DataFrame | None,
) -> Redo:
    """Step 1: the batch's state (and quarantine) rows, durable before the target commit.

    A writer that finds this batch id committed by another attempt removes ours as a
    loser's, possibly while we write it: the write then fails, and we lost the race."""
    redo = Redo(names.redo_root(spark) / f"{batch}-{uuid.uuid4().hex}", batch)
    try:
        state_rows.write.parquet(str(redo.state))
        if quarantine_rows is not None:
            quarantine_rows.write.parquet(str(redo.quarantine))
    except (PySparkException, Py4JJavaError) as error:
        if committed_version(spark, names.target, names.app_id) >= batch:
            shutil.rmtree(redo.folder, ignore_errors=True)
            raise LostRace(f"batch {batch} of {names.target} was committed meanwhile") from error
        raise
    return redo


def commit_target(
    spark: SparkSession,
    names: Tables,
    redo: Redo,
    merge: Callable[[], DataFrame] | None,
    load: DataFrame | None,
) -> dict[str, int]:
    """Step 2: run ``merge``, else append ``load`` (an initial load's rows for an empty
    target) or, with neither, nothing, as the batch's commit point.

    Returns the MERGE's row counts (none for an append). Raises :class:`LostRace` when
    another writer committed this batch id first: the caller recomputes against the new
    state. The redo stays: if the commit was ours after all (an append whose commit a
    faster writer's hid from ``history(1)``), :func:`catch_up` finds it by its token; a
    loser's is removed there once the batch's winner is known."""
    token = f"autocdc:{redo.batch}:{redo.token}"
    try:
        with _transaction(spark, names.app_id, redo.batch, token):
            if merge is not None:
                result = merge().collect()
            else:
                result = None
                if load is None:
                    load = spark.createDataFrame([], tables.read(spark, names.target).schema)
                location = tables.default_location(spark, names.target)
                load.write.format("delta").mode("append").save(location)
    except CONFLICTS as error:
        raise LostRace(str(error)) from error
    if result is None:  # an append Delta skipped says nothing: look at the last commit
        last = tables.delta_table(spark, names.target).history(1).collect()
        result = [] if not last or last[0].userMetadata != token else [None]
    if not result:  # Delta skipped the write: this batch id is taken
        raise LostRace(f"batch {redo.batch} of {names.target} was committed by another writer")
    return result[0].asDict() if result[0] is not None else {}


def apply_quarantine(
    spark: SparkSession, names: Tables, redo: Redo, create: Callable[[], None]
) -> None:
    """Step 3: append the redo's quarantine rows (skipped by Delta if already there)."""
    if not redo.quarantine.is_dir():
        return
    create()
    try:
        rows = spark.read.parquet(str(redo.quarantine))
        _append(spark, names.quarantine, rows, names, redo.batch)
    except (PySparkException, Py4JJavaError):
        # Another writer appended them and a fold removed the folder while we read it.
        if committed_version(spark, names.quarantine, names.app_id) < redo.batch:
            raise


def _append(spark: SparkSession, name: str, rows: DataFrame, names: Tables, batch: int) -> None:
    try:
        (
            rows.write.format("delta")
            .mode("append")
            .option("txnAppId", names.app_id)
            .option("txnVersion", batch)
            .save(tables.default_location(spark, name))
        )
    except CONFLICTS:
        # Another writer appended the same rows at the same time: they are there once.
        if committed_version(spark, name, names.app_id) < batch:
            raise


@dataclass(frozen=True)
class Stored:
    """A flow's state as readers see it: the state table, which holds the batches up to
    ``folded``, and the redo folders of the committed batches above it, up to
    ``committed`` (the target's), in batch order."""

    names: Tables
    committed: int
    folded: int
    pending: tuple[Redo, ...] = ()

    def read(self, spark: SparkSession, schema: StructType) -> DataFrame:
        """Every state row of the committed batches: the table's, then the pending ones."""
        stored = tables.read(spark, self.names.state)
        if not self.pending:
            return stored
        waiting = spark.read.schema(schema).parquet(*[str(r.state) for r in self.pending])
        return stored.unionByName(waiting)

    def after(self, redo: Redo) -> Stored:
        """The state once ``redo``'s batch committed: one more pending batch."""
        return Stored(self.names, redo.batch, self.folded, (*self.pending, redo))

    def fold_due(self) -> bool:
        """Whether enough is pending to fold: ``FOLD_EVERY`` batches or ``FOLD_BYTES``."""
        if len(self.pending) >= FOLD_EVERY:
            return True
        return sum(_bytes(r.state) for r in self.pending) >= FOLD_BYTES

    def vanished(self) -> bool:
        """Whether a pending folder was removed meanwhile (folded twice by another writer
        while this one read it): the batch starts over against the new state."""
        return any(not r.folder.is_dir() for r in self.pending)


def _bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.glob("*.parquet")) if folder.is_dir() else 0


def catch_up(spark: SparkSession, names: Tables, create_quarantine: Callable[[], None]) -> Stored:
    """The committed batches and where their state is: the state table up to its
    ``txnVersion``, the redo folders of the batches above it (the quarantine rows of
    each appended if a crash skipped them)."""
    for _ in range(FOLD_EVERY):
        committed = committed_version(spark, names.target, names.app_id)
        folded = committed_version(spark, names.state, names.app_id)
        if folded >= committed:
            return Stored(names, committed, folded)
        pending = _pending(spark, names, folded, committed)
        if pending is not None:
            quarantined = None
            for redo in pending:
                if redo.quarantine.is_dir():
                    if quarantined is None:
                        quarantined = committed_version(spark, names.quarantine, names.app_id)
                    if quarantined < redo.batch:
                        apply_quarantine(spark, names, redo, create_quarantine)
            return Stored(names, committed, folded, pending)
        if committed_version(spark, names.state, names.app_id) == folded:
            break  # no fold moved the state on meanwhile: the folder is really gone
    raise RedoMissingError(target=names.target, batch=committed, folder=str(names.redo_root(spark)))


def _pending(
    spark: SparkSession, names: Tables, folded: int, committed: int
) -> tuple[Redo, ...] | None:
    """The redo of each batch in (``folded``, ``committed``], None if one is missing."""
    by_batch: dict[int, list[Path]] = {}
    for folder in _redo_folders(names.redo_root(spark)):
        if folded < _batch_of(folder) <= committed:
            by_batch.setdefault(_batch_of(folder), []).append(folder)
    pending = []
    for batch in range(folded + 1, committed + 1):
        candidates = by_batch.get(batch, [])
        if len(candidates) > 1:  # several writers staged this batch: the commit names its token
            token = _committed_token(spark, names, batch)
            winners = [f for f in candidates if token and f.name.endswith(f"-{token}")]
            if len(winners) == 1:
                for loser in set(candidates) - set(winners):
                    shutil.rmtree(loser, ignore_errors=True)  # its commit never happened
            candidates = winners
        if len(candidates) != 1:
            return None
        pending.append(Redo(candidates[0], batch))
    return tuple(pending)


def fold(spark: SparkSession, stored: Stored, schema: StructType) -> Stored:
    """Append the pending state rows to the state table in one commit (``txnVersion``:
    the newest batch folded), then remove the folders an earlier fold folded. A conflict
    leaves them pending (the next batch folds)."""
    if not stored.pending:
        return stored
    names, newest = stored.names, stored.pending[-1].batch
    rows = spark.read.schema(schema).parquet(*[str(r.state) for r in stored.pending])
    try:
        _append(spark, names.state, rows, names, newest)
    except CONFLICTS:
        return stored
    crash_point("after_fold")  # folded, its folders still there: the next catch-up skips them
    for folder in _redo_folders(names.redo_root(spark)):
        if _batch_of(folder) <= stored.folded:
            shutil.rmtree(folder, ignore_errors=True)
    return Stored(names, stored.committed, newest)


def _committed_token(spark: SparkSession, names: Tables, batch: int) -> str:
    prefix = f"autocdc:{batch}:"
    history = tables.delta_table(spark, names.target).history(_HISTORY).collect()
    for row in history:
        if row.userMetadata and row.userMetadata.startswith(prefix):
            return row.userMetadata[len(prefix) :]
    return ""


def _redo_folders(root: Path) -> list[Path]:
    if not root.is_dir():
        return []
    return [f for f in root.iterdir() if f.is_dir() and f.name.partition("-")[0].isdigit()]


def _batch_of(folder: Path) -> int:
    return int(folder.name.partition("-")[0])


def drop_redo(spark: SparkSession, names: Tables) -> None:
    """Remove every redo folder (a full refresh)."""
    shutil.rmtree(names.redo_root(spark), ignore_errors=True)
