"""autocdc: declarative, order-independent Auto CDC for Apache Spark and Delta Lake."""

from __future__ import annotations

from autocdc.engine.errors import (
    AutoCdcError,
    ConcurrentWriteError,
    ConflictingColumnListsError,
    DefinitionChangedError,
    DuplicateColumnError,
    EmptyKeysError,
    InvalidKeyTypeError,
    InvalidRetentionError,
    InvalidSequenceTypeError,
    InvalidSequenceValueError,
    KeyNotSelectedError,
    MissingSequenceError,
    NondeterministicExpressionError,
    ReservedColumnError,
    SchemaMismatchError,
    TrackHistoryColumnNotSelectedError,
    TrackHistoryWithScd1Error,
    TruncateWithScd2Error,
    UnknownColumnError,
)
from autocdc.engine.flow import AutoCdcFlow
from autocdc.engine.logs import log_file
from autocdc.engine.metrics import BatchMetrics
from autocdc.engine.sequences import debezium_sequence, hex_sequence, parse_hex_sequence
from autocdc.engine.session import spark_session

__all__ = [
    "AutoCdcError",
    "AutoCdcFlow",
    "BatchMetrics",
    "ConcurrentWriteError",
    "ConflictingColumnListsError",
    "DefinitionChangedError",
    "DuplicateColumnError",
    "EmptyKeysError",
    "InvalidKeyTypeError",
    "InvalidRetentionError",
    "InvalidSequenceTypeError",
    "InvalidSequenceValueError",
    "KeyNotSelectedError",
    "MissingSequenceError",
    "NondeterministicExpressionError",
    "ReservedColumnError",
    "SchemaMismatchError",
    "TrackHistoryColumnNotSelectedError",
    "TrackHistoryWithScd1Error",
    "TruncateWithScd2Error",
    "UnknownColumnError",
    "debezium_sequence",
    "hex_sequence",
    "log_file",
    "parse_hex_sequence",
    "spark_session",
]
