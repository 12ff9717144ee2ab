"""Turn vendor change positions into values that order correctly.

BigQuery-style sequence numbers (``_CHANGE_SEQUENCE_NUMBER``) and PostgreSQL LSNs are up
to four hexadecimal sections separated by ``/``, compared section by section as numbers:
``"16/B374D848"`` > ``"9/FFFFFFFF"`` although it is smaller as a string.
"""

from __future__ import annotations

import re

from pyspark.sql import Column
from pyspark.sql import functions as F

from autocdc.engine.errors import InvalidSequenceValueError

MAX_SECTIONS = 4
HEX_SECTIONS = r"^[0-9A-Fa-f]{1,16}(/[0-9A-Fa-f]{1,16}){0,3}$"


def parse_hex_sequence(value: str) -> tuple[int, ...]:
    """``"16/B374D848"`` -> ``(22, 3010778184)``; Python tuples order like the Spark value.

    >>> parse_hex_sequence("16/B374D848") > parse_hex_sequence("9/FFFFFFFF")
    True
    """
    if not isinstance(value, str) or not re.match(HEX_SECTIONS, value):
        raise InvalidSequenceValueError(
            value=value,
            kind="hex-section sequence",
            why="expected 1 to 4 sections of 1 to 16 hex digits separated by '/'",
            example="'16/B374D848'",
        )
    return tuple(int(section, 16) for section in value.split("/"))


def hex_sequence(column: str | Column) -> Column:
    """A Spark struct of four sections (unsigned 64-bit), ordered section by section.

    Missing sections are -1, so they order first, like a shorter tuple in Python. A value
    that is not of the form is NULL, so its row is quarantined as a NULL sequence (a flow
    with no ``sequence_by`` tells the two apart: see ``autocdc.engine.change_rows``).
    """
    value = F.col(column) if isinstance(column, str) else column
    sections = F.split(value, "/")
    valid = value.rlike(HEX_SECTIONS)
    return F.when(
        valid,
        F.struct(
            *[
                F.coalesce(
                    F.conv(F.get(sections, i), 16, 10).cast("decimal(20,0)"),
                    F.lit(-1).cast("decimal(20,0)"),
                ).alias(f"s{i}")
                for i in range(MAX_SECTIONS)
            ]
        ),
    )
