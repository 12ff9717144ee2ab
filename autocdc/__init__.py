"""autocdc: declarative, order-independent Auto CDC for Apache Spark and Delta Lake."""

from __future__ import annotations

from autocdc.errors import (
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
    NondeterministicExpressionError,
    ReservedColumnError,
    SchemaMismatchError,
    TrackHistoryColumnNotSelectedError,
    TrackHistoryWithScd1Error,
    TruncateWithScd2Error,
    UnknownColumnError,
)
from autocdc.flow import AutoCdcFlow
from autocdc.metrics import BatchMetrics
from autocdc.sequences import debezium_sequence, hex_sequence, parse_hex_sequence
from autocdc.session import spark_session

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
    "NondeterministicExpressionError",
    "ReservedColumnError",
    "SchemaMismatchError",
    "TrackHistoryColumnNotSelectedError",
    "TrackHistoryWithScd1Error",
    "TruncateWithScd2Error",
    "UnknownColumnError",
    "debezium_sequence",
    "hex_sequence",
    "parse_hex_sequence",
    "spark_session",
]
