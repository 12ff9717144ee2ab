"""BigQuery-style change rows: a feed that carries its own sequence and operation.

A flow with no ``sequence_by`` (the *auto mode*) orders changes by
``_CHANGE_SEQUENCE_NUMBER`` (1 to 4 hex sections separated by ``/``, compared section by
section as numbers) and, unless ``apply_as_deletes`` or ``apply_as_truncates`` is given,
reads each row's operation from ``_CHANGE_TYPE``: ``UPSERT``, ``DELETE``, or ``TRUNCATE``
(an autocdc extension; SCD type 1 only). Like BigQuery's pseudo-columns, neither column
is stored in the target unless ``column_list`` names it. A flow with ``sequence_by``
never looks at these columns.

Column names match exactly: a Delta change data feed's ``_change_type`` holds other values
(``insert``, ``update_postimage``). ``_CHANGE_TYPE`` values match case-insensitively,
without trimming (``delete`` is as unambiguous as ``DELETE``). A row these columns cannot
place is quarantined with its own reason, and the batch goes on.
"""

from __future__ import annotations

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructType

from autocdc.engine.errors import (
    QUARANTINE_MALFORMED_SEQUENCE,
    QUARANTINE_TRUNCATE_IN_SCD2,
    QUARANTINE_UNKNOWN_CHANGE_TYPE,
    MissingSequenceError,
)
from autocdc.engine.sequences import HEX_SECTIONS, hex_sequence
from autocdc.engine.tables import ident

CHANGE_TYPE = "_CHANGE_TYPE"
# A source's mark on a row that carries no change (a Kafka tombstone): when a batch has
# this boolean column, its true rows are counted as ``skipped``, never applied, quarantined
# or stored.
NO_CHANGE = "__autocdc_no_change"
CHANGE_SEQUENCE_NUMBER = "_CHANGE_SEQUENCE_NUMBER"
PSEUDO_COLUMNS = (CHANGE_TYPE, CHANGE_SEQUENCE_NUMBER)
UPSERT, DELETE, TRUNCATE = "UPSERT", "DELETE", "TRUNCATE"


def require(schema: StructType) -> None:
    """The auto mode needs the sequence column, as text: a number read as hex sections
    would order correctly only up to 16 digits, so it is refused rather than half-working."""
    types = {f.name: f.dataType for f in schema.fields}
    found = types.get(CHANGE_SEQUENCE_NUMBER)
    if not isinstance(found, StringType):
        raise MissingSequenceError(
            type=found.simpleString() if found else None, available=schema.names
        )


def sequence() -> Column:
    return hex_sequence(F.col(ident(CHANGE_SEQUENCE_NUMBER)))


def _change_type() -> Column:
    return F.upper(F.col(ident(CHANGE_TYPE)))


def is_delete() -> Column:
    return F.coalesce(_change_type() == DELETE, F.lit(False))


def is_truncate() -> Column:
    return F.coalesce(_change_type() == TRUNCATE, F.lit(False))


def checks(reads_change_type: bool, stored_as_scd_type: int) -> list[tuple[Column, str]]:
    """Quarantine conditions of a flow in the auto mode, on the source columns, in order;
    ``reads_change_type``: its operations come from ``_CHANGE_TYPE`` (see
    ``FlowDefinition.reads_change_type``).

    A malformed sequence would otherwise read as NULL (the NULL-sequence reason stays for
    a NULL one); SCD type 2 keeps history, so it refuses a truncate row as it refuses
    ``apply_as_truncates``.
    """
    value = F.col(ident(CHANGE_SEQUENCE_NUMBER))
    found = [(value.isNotNull() & ~value.rlike(HEX_SECTIONS), QUARANTINE_MALFORMED_SEQUENCE)]
    if reads_change_type:
        known = F.coalesce(_change_type().isin(UPSERT, DELETE, TRUNCATE), F.lit(False))
        found.append((~known, QUARANTINE_UNKNOWN_CHANGE_TYPE))
        if stored_as_scd_type == 2:
            found.append((is_truncate(), QUARANTINE_TRUNCATE_IN_SCD2))
    return found
