"""The commit protocol: the target's commit is the batch's commit point.

A batch writes three tables (target, state, quarantine) and no transaction covers them
all. The protocol makes one of them, the target, decide:

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
3. **Redo applied.** The redo's state rows are appended to the state table, and its
   quarantine rows to the quarantine table, each with the same ``(app, batch)``, so a
   repeat is skipped by Delta; then the redo folder goes.

Every batch starts with :func:`catch_up`: when the state table's version for the app is
behind the target's, the process that committed the target died before step 3, and the
redo of the committed batch (the one whose token the target's commit names) is applied
now. Only then is state read, so every reader sees state that describes the target
exactly, whatever the crash. A redo whose target commit never happened (a crash before
step 2, or a writer that lost) is never applied; it is removed once the state is past
its batch. A crash anywhere therefore leaves either the old batch (redo ignored) or the
new one (redo applied by whoever comes next), never a mix, and a replay of the same
changes afterwards is judged against the state that includes them.

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
    time to plan it, 0.5-1.2 s) the first time a new version is read, and a batch reads
    two tables that the batch before it committed: the state (the plan) and the target
    (the MERGE). Rebuilt beside the stage and the plan, which leave a core idle while
    the driver plans, a batch's own reads find them ready: 100k changes into 1M rows
    took 0.89-0.97x the time, 100-change batches 0.92-0.99x (SCD1 and SCD2, paired).
    The rebuild runs in a session of its own, interpreted: a batch into a large table
    switches its own session to compiled expressions meanwhile (``tuning.fit_to_size``),
    under which a rebuild took twice as long (0.35-0.7 s against 0.2-0.35 s per table
    after a batch into 1M rows). Delta keeps a table's snapshot per path, whichever
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

    A writer that commits this batch id first removes every redo folder up to it, ours
    too, possibly while we write it: the write then fails, and we lost the race."""
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
    state (if the commit was ours after all, that run finds it through :func:`catch_up`)."""
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


def apply_redo(
    spark: SparkSession,
    names: Tables,
    redo: Redo,
    state_schema: StructType,
    create_quarantine: Callable[[], None],
) -> None:
    """Step 3: append the redo to the state and quarantine tables (each skipped by Delta
    if it was already appended), then drop every redo folder up to this batch."""
    try:
        if redo.quarantine.is_dir():
            create_quarantine()
            quarantined = spark.read.parquet(str(redo.quarantine))
            _append(spark, names.quarantine, quarantined, names, redo)
        crash_point("after_quarantine")
        # The state last: its version is what catch_up compares with the target's.
        rows = spark.read.schema(state_schema).parquet(str(redo.state))
        _append(spark, names.state, rows, names, redo)
    except (PySparkException, Py4JJavaError):
        # Another writer applied this redo and removed it while this one read it.
        if committed_version(spark, names.state, names.app_id) < redo.batch:
            raise
    for folder in _redo_folders(names.redo_root(spark)):
        if _batch_of(folder) <= redo.batch:
            shutil.rmtree(folder, ignore_errors=True)


def _append(spark: SparkSession, name: str, rows: DataFrame, names: Tables, redo: Redo) -> None:
    try:
        (
            rows.write.format("delta")
            .mode("append")
            .option("txnAppId", names.app_id)
            .option("txnVersion", redo.batch)
            .save(tables.default_location(spark, name))
        )
    except CONFLICTS:
        # Another writer appended the same redo at the same time: it is there once.
        if committed_version(spark, name, names.app_id) < redo.batch:
            raise


def catch_up(
    spark: SparkSession,
    names: Tables,
    state_schema: StructType,
    create_quarantine: Callable[[], None],
) -> int:
    """Apply the redo of a batch whose target commit happened but whose state append did
    not (the writer died in between); return the target's committed batch id."""
    committed = committed_version(spark, names.target, names.app_id)
    if committed_version(spark, names.state, names.app_id) >= committed:
        return committed
    candidates = [f for f in _redo_folders(names.redo_root(spark)) if _batch_of(f) == committed]
    if len(candidates) > 1:  # several writers staged this batch: the commit names its token
        token = _committed_token(spark, names, committed)
        candidates = [f for f in candidates if f.name.endswith(f"-{token}")]
    if len(candidates) != 1:
        if committed_version(spark, names.state, names.app_id) >= committed:
            return committed  # another writer applied it (and removed it) meanwhile
        raise RedoMissingError(
            target=names.target, batch=committed, folder=str(names.redo_root(spark))
        )
    apply_redo(spark, names, Redo(candidates[0], committed), state_schema, create_quarantine)
    return committed


def _committed_token(spark: SparkSession, names: Tables, batch: int) -> str:
    prefix = f"autocdc:{batch}:"
    history = tables.delta_table(spark, names.target).history(50).collect()
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
