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
from functools import cached_property

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

    @cached_property
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


_STRUCTS: dict[str, struct.Struct] = {}
_INT16, _INT32 = struct.Struct("!h"), struct.Struct("!i")
_NULL, _TOAST, _TEXT = ord("n"), ord("u"), ord("t")


class _Reader:
    """Reads one message. Every change passes through here, so formats are compiled once
    and a tuple's values are read in one loop (a busy database sends tens of thousands a
    second, decoded in one Python process)."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.at = 0

    def unpack(self, fmt: str) -> tuple:
        compiled = _STRUCTS.get(fmt) or _STRUCTS.setdefault(fmt, struct.Struct(fmt))
        values = compiled.unpack_from(self.data, self.at)
        self.at += compiled.size
        return values

    def byte(self) -> str:
        value = self.data[self.at]
        self.at += 1
        return chr(value)

    def string(self) -> str:
        end = self.data.index(b"\0", self.at)
        text = self.data[self.at : end].decode()
        self.at = end + 1
        return text

    def tuple_data(self) -> Values:
        data, at = self.data, self.at
        (count,) = _INT16.unpack_from(data, at)
        at += 2
        values: list[object] = []
        for _ in range(count):
            kind = data[at]
            at += 1
            if kind == _TEXT:
                (length,) = _INT32.unpack_from(data, at)
                at += 4
                if at + length > len(data):
                    raise DecodeError("a value runs past the end of the message")
                values.append(data[at : at + length].decode())
                at += length
            elif kind == _NULL:
                values.append(None)
            elif kind == _TOAST:
                values.append(UNCHANGED_TOAST)
            else:
                raise DecodeError(f"unknown tuple value kind {chr(kind)!r}")
        self.at = at
        return tuple(values)


def decode(data: bytes) -> Message:
    """One message; None for the kinds change capture does not need."""
    try:
        return _decode(_Reader(bytes(data)))
    except (struct.error, ValueError, UnicodeDecodeError, IndexError) as error:
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
