"""Decode PostgreSQL's built-in ``pgoutput`` logical decoding messages (protocol 1).

Why pgoutput and not wal2json: it ships with every PostgreSQL since 10 (managed services
included), needs no extension on the server, and its Relation messages carry what a CDC
reader needs: each column's type and whether it is part of the replica identity (the key).

Only what change capture uses is decoded: Begin, Commit, Relation, Insert, Update, Delete,
Truncate. Type and Origin messages are skipped. Values arrive in PostgreSQL's text form.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

UNCHANGED_TOAST = object()  # an Update's value that was not sent: a large value, not changed


@dataclass(frozen=True)
class Column:
    name: str
    type_oid: int
    is_key: bool


@dataclass(frozen=True)
class Relation:
    oid: int
    schema: str
    name: str
    replica_identity: str  # d(efault: primary key), n(othing), f(ull), i(ndex)
    columns: tuple[Column, ...]

    @property
    def qualified(self) -> str:
        return f"{self.schema}.{self.name}"


Values = tuple[object, ...]  # str | None | UNCHANGED_TOAST per column


@dataclass(frozen=True)
class Begin:
    commit_lsn: int
    xid: int


@dataclass(frozen=True)
class Commit:
    commit_lsn: int
    end_lsn: int


@dataclass(frozen=True)
class Insert:
    relation: int
    new: Values


@dataclass(frozen=True)
class Update:
    relation: int
    old: Values | None  # sent when the key changed ('K') or with REPLICA IDENTITY FULL ('O')
    new: Values


@dataclass(frozen=True)
class Delete:
    relation: int
    old: Values  # the key columns ('K'), or the whole row with REPLICA IDENTITY FULL ('O')


@dataclass(frozen=True)
class Truncate:
    relations: tuple[int, ...]


Message = Begin | Commit | Relation | Insert | Update | Delete | Truncate | None


class DecodeError(Exception):
    """A message this decoder cannot read: the change is quarantined with its bytes."""


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.at = 0

    def unpack(self, fmt: str) -> tuple:
        values = struct.unpack_from(fmt, self.data, self.at)
        self.at += struct.calcsize(fmt)
        return values

    def byte(self) -> str:
        return chr(self.unpack("!B")[0])

    def string(self) -> str:
        end = self.data.index(b"\0", self.at)
        text = self.data[self.at : end].decode()
        self.at = end + 1
        return text

    def tuple_data(self) -> Values:
        (count,) = self.unpack("!h")
        values: list[object] = []
        for _ in range(count):
            kind = self.byte()
            if kind == "n":
                values.append(None)
            elif kind == "u":
                values.append(UNCHANGED_TOAST)
            elif kind == "t":
                (length,) = self.unpack("!i")
                values.append(self.data[self.at : self.at + length].decode())
                self.at += length
            else:
                raise DecodeError(f"unknown tuple value kind {kind!r}")
        return tuple(values)


def decode(data: bytes) -> Message:
    """One message; None for the kinds change capture does not need."""
    try:
        return _decode(_Reader(bytes(data)))
    except (struct.error, ValueError, UnicodeDecodeError) as error:
        raise DecodeError(str(error)) from error


def _decode(r: _Reader) -> Message:
    kind = r.byte()
    if kind == "B":
        commit_lsn, _timestamp, xid = r.unpack("!qqI")
        return Begin(commit_lsn=commit_lsn, xid=xid)
    if kind == "C":
        _flags, commit_lsn, end_lsn, _timestamp = r.unpack("!Bqqq")
        return Commit(commit_lsn=commit_lsn, end_lsn=end_lsn)
    if kind == "R":
        (oid,) = r.unpack("!I")
        schema, name, identity = r.string(), r.string(), r.byte()
        (count,) = r.unpack("!h")
        columns = []
        for _ in range(count):
            (flags,) = r.unpack("!B")
            column = r.string()
            type_oid, _typmod = r.unpack("!Ii")
            columns.append(Column(name=column, type_oid=type_oid, is_key=bool(flags & 1)))
        return Relation(oid, schema, name, identity, tuple(columns))
    if kind == "I":
        (relation,) = r.unpack("!I")
        r.byte()  # 'N'
        return Insert(relation=relation, new=r.tuple_data())
    if kind == "U":
        (relation,) = r.unpack("!I")
        old = None
        marker = r.byte()
        if marker in ("K", "O"):
            old = r.tuple_data()
            marker = r.byte()
        if marker != "N":
            raise DecodeError(f"update without a new tuple (marker {marker!r})")
        return Update(relation=relation, old=old, new=r.tuple_data())
    if kind == "D":
        (relation,) = r.unpack("!I")
        r.byte()  # 'K' or 'O'
        return Delete(relation=relation, old=r.tuple_data())
    if kind == "T":
        count, _options = r.unpack("!iB")
        return Truncate(relations=r.unpack(f"!{count}I"))
    if kind in ("Y", "O", "M"):  # type, origin, logical message
        return None
    raise DecodeError(f"unknown message kind {kind!r}")


def format_lsn(lsn: int) -> str:
    """``22548365968`` -> ``"5/400"``-style, as PostgreSQL prints an LSN."""
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def parse_lsn(text: str) -> int:
    high, low = text.split("/")
    return (int(high, 16) << 32) | int(low, 16)
