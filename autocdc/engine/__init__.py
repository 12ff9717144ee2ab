"""The engine: one batch of changes in, order-independent SCD type 1 or 2 out.

The modules read like the data flow: spec -> fit (against the stored tables) -> stage
(validate) -> batch (its counts) -> scd1/scd2 (reconcile with the state table: a plan;
each a package of reconcile, merge, preview) -> quarantine -> write (with commit's
protocol: redo, the target MERGE as the commit point, the state) -> metrics; flow lists
those steps, staged wraps a flow for ``max_staleness`` (its table in staged_table), gc
compacts the state, tables holds the Delta plumbing. snapshot applies whole snapshots
through a flow; warmup is the workload of the runtime's class archive.

The engine sits on :mod:`autocdc.runtime` (the session, the warehouse's layout, the root
error) and imports nothing above it. This package exports what the layers above use
(:mod:`autocdc.sources`, :mod:`autocdc.pipelines`, the public API of :mod:`autocdc`):
they import from here, never from a module of the engine, so its modules can move freely.
"""

from __future__ import annotations

# The values of a change row's ``_CHANGE_TYPE`` (the staged operations are others).
from autocdc.engine.change_rows import (
    CHANGE_SEQUENCE_NUMBER,
    CHANGE_TYPE,
    DELETE,
    NO_CHANGE,
    TRUNCATE,
    UPSERT,
)
from autocdc.engine.errors import (
    DefinitionChangedError,
    EngineError,
    MaxStalenessUnsupportedError,
    SnapshotSequenceError,
    TargetNotPartialError,
    UnknownConnectorError,
)
from autocdc.engine.faults import crash_point, fail_point
from autocdc.engine.flow import CURRENT_VIEW_SUFFIX, AutoCdcFlow
from autocdc.engine.metrics import BatchMetrics
from autocdc.engine.sequences import hex_sequence, parse_hex_sequence
from autocdc.engine.snapshot import (
    DEFAULT_MAX_DELETE_FRACTION,
    AutoCdcSnapshotFlow,
    NextSnapshot,
    SnapshotDefinition,
)
from autocdc.engine.spec import END_AT, START_AT, ColumnOrSql, FlowDefinition, to_column
from autocdc.engine.stage import CORRUPT_RECORD_CONF, sequence_type
from autocdc.engine.tables import QUARANTINE_SUFFIX, STATE_SUFFIX, col, ident
from autocdc.engine.tables import exists as table_exists
from autocdc.engine.tuning import session_conf

__all__ = [
    "CHANGE_SEQUENCE_NUMBER",
    "CHANGE_TYPE",
    "CORRUPT_RECORD_CONF",
    "CURRENT_VIEW_SUFFIX",
    "DEFAULT_MAX_DELETE_FRACTION",
    "DELETE",
    "END_AT",
    "NO_CHANGE",
    "QUARANTINE_SUFFIX",
    "START_AT",
    "STATE_SUFFIX",
    "TRUNCATE",
    "UPSERT",
    "AutoCdcFlow",
    "AutoCdcSnapshotFlow",
    "BatchMetrics",
    "ColumnOrSql",
    "DefinitionChangedError",
    "EngineError",
    "FlowDefinition",
    "MaxStalenessUnsupportedError",
    "NextSnapshot",
    "SnapshotDefinition",
    "SnapshotSequenceError",
    "TargetNotPartialError",
    "UnknownConnectorError",
    "col",
    "crash_point",
    "fail_point",
    "hex_sequence",
    "ident",
    "parse_hex_sequence",
    "sequence_type",
    "session_conf",
    "table_exists",
    "to_column",
]
