"""autocdc: declarative, order-independent Auto CDC for Apache Spark and Delta Lake."""

from __future__ import annotations

from autocdc.engine.errors import (
    AutoCdcError,
    ColumnNotSelectedError,
    ConcurrentWriteError,
    ConflictingColumnListsError,
    ConflictingIgnoreNullUpdatesError,
    DefinitionChangedError,
    DuplicateColumnError,
    EmptyKeysError,
    EngineError,
    InvalidColumnsToUpdateError,
    InvalidKeyTypeError,
    InvalidRetentionError,
    InvalidSequenceTypeError,
    InvalidSequenceValueError,
    KeyNotSelectedError,
    MissingSequenceError,
    NondeterministicExpressionError,
    RedoMissingError,
    ReservedColumnError,
    SchemaMismatchError,
    SnapshotDuplicateKeyError,
    SnapshotInvalidVersionError,
    SnapshotMassDeleteError,
    SnapshotNullKeyError,
    SnapshotVersionNotNewerError,
    StateFormatError,
    TargetNotPartialError,
    TrackHistoryColumnNotSelectedError,
    TrackHistoryWithScd1Error,
    TruncateWithScd2Error,
    UnknownColumnError,
    UnknownConnectorError,
)
from autocdc.engine.flow import AutoCdcFlow
from autocdc.engine.logs import log_file
from autocdc.engine.metrics import BatchMetrics
from autocdc.engine.sequences import hex_sequence, parse_hex_sequence
from autocdc.engine.snapshot import AutoCdcSnapshotFlow
from autocdc.sources import spark_session
from autocdc.sources.debezium import debezium_changes, debezium_kafka, debezium_sequence
from autocdc.sources.errors import SourceError
from autocdc.sources.postgres import postgres_table

__all__ = [
    "AutoCdcError",
    "AutoCdcFlow",
    "AutoCdcSnapshotFlow",
    "BatchMetrics",
    "ColumnNotSelectedError",
    "ConcurrentWriteError",
    "ConflictingColumnListsError",
    "ConflictingIgnoreNullUpdatesError",
    "DefinitionChangedError",
    "DuplicateColumnError",
    "EmptyKeysError",
    "EngineError",
    "InvalidColumnsToUpdateError",
    "InvalidKeyTypeError",
    "InvalidRetentionError",
    "InvalidSequenceTypeError",
    "InvalidSequenceValueError",
    "KeyNotSelectedError",
    "MissingSequenceError",
    "NondeterministicExpressionError",
    "RedoMissingError",
    "ReservedColumnError",
    "SchemaMismatchError",
    "SnapshotDuplicateKeyError",
    "SnapshotInvalidVersionError",
    "SnapshotMassDeleteError",
    "SnapshotNullKeyError",
    "SnapshotVersionNotNewerError",
    "SourceError",
    "StateFormatError",
    "TargetNotPartialError",
    "TrackHistoryColumnNotSelectedError",
    "TrackHistoryWithScd1Error",
    "TruncateWithScd2Error",
    "UnknownColumnError",
    "UnknownConnectorError",
    "debezium_changes",
    "debezium_kafka",
    "debezium_sequence",
    "hex_sequence",
    "log_file",
    "parse_hex_sequence",
    "postgres_table",
    "spark_session",
]
