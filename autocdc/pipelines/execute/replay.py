"""Replay one flow from a position of its source: what a replay is, and where it puts
the flow's read.

``autocdc run --replay-from FLOW=KIND:VALUE`` (``dp.run(..., replay_from=...)``) rewinds
one AUTO CDC flow's read of its source, then the run goes on as any run: the flow reads
again from there, and its target takes the changes again. The target is not truncated:
a change it holds already is a no-op in the fold (docs/semantics.md), so the target ends
as the fold of every change it was given, the replayed ones included, whatever the
position. :mod:`autocdc.pipelines.execute.rewind` does it to a run's flow, with this
module's parts:

* :func:`parse`: the position as the user gives it, checked for its kind;
* :func:`delta`, :func:`kafka`, :func:`watermark`: the position turned into the offset
  Spark's checkpoint records for the source, checked against what the source still holds
  before anything is written. Driver-side and cheap, as
  :mod:`autocdc.pipelines.execute.position` is: a Delta source is read from its
  ``_delta_log`` (a version's change data is there while its commit file and the files it
  added are), a Kafka source from its broker (each partition's earliest retained offset).
  An offset is the one Spark writes for the source: a Delta version ``v`` read as changes
  from its first file is ``(v, index -1)``, a Kafka partition's is the next offset to
  read. A WATERMARK extraction's position is its checkpoint, which a table (its rows'
  state now) always holds. A position beyond what the source holds is refused, naming the
  oldest one it holds; one ahead of the flow's too: it would skip the changes in between;
* :func:`append_batch`, :func:`finish`: the flow's checkpoint gets one more micro-batch,
  empty and committed, that ends at the new offset, so Spark's next batch starts there
  (the checkpoint keeps its history: its id, its offset and commit logs). The two files
  of that batch (its offsets, then its commit) are written from a note in the checkpoint
  folder (``autocdc-replay.json``), itself written first and removed last: a run killed
  between them leaves the note, and the flow's next start writes them again
  (:func:`finish`) before Spark reads the checkpoint.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlparse

import pyarrow.parquet as pq

from autocdc.pipelines.errors import ReplayBeyondRetentionError, ReplayPositionError
from autocdc.pipelines.execute import position as pos
from autocdc.pipelines.execute.checkpoint import write_atomically
from autocdc.sources import kafkabroker
from autocdc.sources import pgoutput as pg

if TYPE_CHECKING:
    from autocdc.sources.extract import Extraction

NOTE = "autocdc-replay.json"
KINDS = ("version", "timestamp", "offsets", "lsn", "watermark")
EARLIEST = "earliest"
_LSN = re.compile(r"[0-9A-Fa-f]{1,8}/[0-9A-Fa-f]{1,8}")


@dataclass(frozen=True)
class Replay:
    """One flow, one position: ``kind`` (``version``, ``timestamp``, ``offsets``, ``lsn``
    or ``watermark``) and its ``value`` (an int, an aware datetime, Kafka offsets or
    ``"earliest"``, an LSN as a number, a watermark's values by column)."""

    flow: str
    kind: str
    value: Any
    given: str  # as the user wrote it

    @property
    def position(self) -> str:
        return self.given.partition("=")[2].strip()

    def refused(self, problem: str) -> ReplayPositionError:
        return ReplayPositionError(given=self.given, problem=problem)


def parse(given: str) -> Replay:
    """``FLOW=KIND:VALUE`` -> a :class:`Replay`; the value is checked for its kind here
    (whether the flow's source has such positions, when the run begins).

    >>> parse("orders=version:12").value
    12
    >>> parse('events=offsets:{"t":{"0":5}}').value
    {'t': {'0': 5}}
    """
    flow, _, position = given.partition("=")
    kind, _, text = position.partition(":")
    flow, kind, text = flow.strip(), kind.strip().lower(), text.strip()
    replay = Replay(flow, kind, None, given)
    if not flow or not text:
        raise replay.refused("it names no flow or no position")
    if kind not in KINDS:
        raise replay.refused(f"{kind!r} is not a kind of position ({', '.join(KINDS)})")
    return Replay(flow, kind, _value(replay, text), given)


def _value(replay: Replay, text: str) -> Any:
    if replay.kind == "version":
        if not text.isdigit():
            raise replay.refused(f"a version is a number from 0 up, not {text!r}")
        return int(text)
    if replay.kind == "lsn":
        if not _LSN.fullmatch(text):
            raise replay.refused(
                f"an LSN is written as PostgreSQL prints it (16/B374D848), not {text!r}"
            )
        return pg.parse_lsn(text)
    if replay.kind == "timestamp":
        try:
            at = datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            raise replay.refused(f"{text!r} is not an ISO 8601 time") from None
        return at if at.tzinfo else at.replace(tzinfo=timezone.utc)  # no zone: UTC
    if replay.kind == "watermark":
        try:
            values = json.loads(text, parse_float=Decimal)  # a decimal kept exact
        except json.JSONDecodeError:
            values = None
        if not isinstance(values, dict) or not all(
            isinstance(v, str | int | Decimal | None) for v in values.values()
        ):
            raise replay.refused('a watermark is JSON, {"cdc_order column": value}')
        return values
    if text == EARLIEST:
        return text
    try:
        offsets = json.loads(text)
        valid = isinstance(offsets, dict) and all(
            isinstance(parts, dict)
            and all(str(p).isdigit() and isinstance(o, int) and o >= 0 for p, o in parts.items())
            for parts in offsets.values()
        )
    except json.JSONDecodeError:
        valid = False
    if not valid:
        raise replay.refused('offsets are JSON, {"topic": {"partition": offset}}, or earliest')
    return offsets


def _commit(table: Path, version: int) -> list[dict[str, Any]]:
    text = (table / "_delta_log" / f"{version:020d}.json").read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _file(table: Path, given: str) -> Path:
    """A file an action names: relative to the table (URL-encoded) or an absolute URI."""
    parsed = urlparse(given)
    if parsed.scheme:
        return Path(unquote(parsed.path))
    return table / unquote(given)


def _readable(table: Path, version: int) -> bool:
    """Whether a stream can still read ``version``'s changes: its commit file and every
    file it added as data (a change data feed's ``cdc`` files too) are there. A file that
    a later commit removed is gone once VACUUM ran."""
    try:
        actions = _commit(table, version)
    except FileNotFoundError:
        return False
    for action in actions:
        added = action.get("add")
        if added and added.get("dataChange", True) and not _file(table, added["path"]).exists():
            return False
        cdc = action.get("cdc")
        if cdc and not _file(table, cdc["path"]).exists():
            return False
    return True


def oldest_readable(table: Path, versions: list[int]) -> int | None:
    """The oldest version from which every later version is still readable (None: not
    even the newest is)."""
    oldest = None
    for version in reversed(versions):
        if oldest is not None and version != oldest - 1:
            break  # a gap in the commit files
        if not _readable(table, version):
            break
        oldest = version
    return oldest


def commit_times(table: Path, versions: list[int]) -> dict[int, datetime]:
    """When each version was committed, as Delta tells it (``DESCRIBE HISTORY``,
    ``timestampAsOf``): its in-commit timestamp where the table keeps them, else its commit
    file's modification time, made to increase with the version."""
    times: dict[int, datetime] = {}
    last = None
    for version in versions:
        path = table / "_delta_log" / f"{version:020d}.json"
        with path.open() as commit:
            first = json.loads(commit.readline() or "{}")
        millis = (first.get("commitInfo") or {}).get("inCommitTimestamp")
        if millis is None:
            millis = int(path.stat().st_mtime * 1000)
            millis = millis if last is None else max(millis, last + 1)
        last = millis
        times[version] = datetime.fromtimestamp(millis / 1000, timezone.utc)
    return times


def _at_time(replay: Replay, table: Path, versions: list[int]) -> int:
    """The first version committed at or after the time; one before the oldest commit the
    log keeps when that is it and older ones were cleaned up (they may be later still)."""
    times = commit_times(table, versions)
    later = [v for v in versions if times[v] >= replay.value]
    if not later:
        at = times[versions[-1]].isoformat()
        newest = f"the newest, {versions[-1]}, at {at}"
        raise replay.refused(f"no version of {table} was committed then or later ({newest})")
    return later[0] - (later[0] == versions[0] > 0)


def _lsns(table: Path, version: int) -> list[int]:
    """The LSNs of the rows ``version`` added to a PostgreSQL capture's change table (its
    ``lsn`` column, as :mod:`autocdc.sources.pgchanges` writes it)."""
    found: list[int] = []
    for action in _commit(table, version):
        added = action.get("add")
        if added and added.get("dataChange", True):
            read = pq.read_table(_file(table, added["path"]), columns=["lsn"])
            found += [pg.parse_lsn(v) for v in read.column(0).to_pylist() if v]
    return found


def _at_lsn(replay: Replay, table: Path, versions: list[int], oldest: int | None) -> int:
    """The first version of a change table that added a row at or after the LSN. The
    capture appends in LSN order, so the search goes back from the newest version and
    stops at the first one wholly before the LSN: it reads what the replay will read.
    One before the oldest readable version when the LSN precedes every row that one
    holds and older versions are gone."""
    try:
        names = pq.read_schema(next(_data_files(table, versions))).names
    except StopIteration:
        names = []
    if "lsn" not in names:
        raise replay.refused(f"{table} has no lsn column: it is no PostgreSQL change table")
    if oldest is None:
        return -1  # not even the newest version is readable
    found, first_lsn, newest_lsn = None, None, None
    for version in reversed(versions[versions.index(oldest) :]):
        lsns = _lsns(table, version)
        if not lsns:
            continue
        newest_lsn = newest_lsn or max(lsns)
        if max(lsns) < replay.value:
            break
        found, first_lsn = version, min(lsns)
    if found is None:
        held = f"its newest row's is {pg.format_lsn(newest_lsn)}" if newest_lsn else "it is empty"
        raise replay.refused(f"no row of {table} is at or after that LSN ({held})")
    return found - (found == oldest > 0 and first_lsn > replay.value)


def _data_files(table: Path, versions: list[int]) -> Iterator[Path]:
    for version in versions:
        for action in _commit(table, version):
            added = action.get("add")
            if added and added.get("dataChange", True) and _file(table, added["path"]).exists():
                yield _file(table, added["path"])


def delta(
    replay: Replay, dataset: str, source: dict[str, Any], offset: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the Delta source's offset from which to read ``version:``, ``timestamp:`` or, in a
    PostgreSQL capture's change table, ``lsn:``, and what the event log records of it):
    refused when the table no longer holds the changes of every version from there."""
    table = Path(source["path"])
    if replay.kind not in ("version", "timestamp", "lsn"):
        raise replay.refused(
            f"the flow reads the Delta table {table}: give version:, timestamp: or (a "
            "PostgreSQL change table) lsn:"
        )
    versions = pos.delta_versions(table)
    if not versions:
        raise replay.refused(f"{table} has no commits")
    oldest = oldest_readable(table, versions)
    if replay.kind == "timestamp":
        version = _at_time(replay, table, versions)
    elif replay.kind == "lsn":
        version = _at_lsn(replay, table, versions, oldest)
    else:
        version = replay.value
    if version > versions[-1]:
        raise replay.refused(f"the newest version of {table} is {versions[-1]}")
    if version > offset["reservoirVersion"]:  # it would skip the versions in between
        raise replay.refused(
            f"version {version} is ahead of the flow (at version "
            f"{offset['reservoirVersion']}): a replay goes back"
        )
    if oldest is None or version < oldest:
        held = "none"
        if oldest is not None:
            at = commit_times(table, versions[versions.index(oldest) :])[oldest]
            held = f"version:{oldest} (committed {at.isoformat()})"
        raise ReplayBeyondRetentionError(
            flow=replay.flow,
            dataset=dataset,
            position=replay.position,
            source=str(table),
            why=f"the commit or the data files of version {version} are gone (log cleanup "
            "or VACUUM)",
            oldest=held,
        )
    # (v, index -1): before every file of version v, read as changes, not as a snapshot;
    # -1 is the index's form in version 1 of Delta's offset format.
    rewound = {
        **offset,
        "sourceVersion": 1,
        "reservoirVersion": version,
        "index": -1,
        "isStartingVersion": False,
    }
    return rewound, {"version": version}


def kafka(
    replay: Replay,
    dataset: str,
    source: dict[str, Any],
    offset: dict[str, dict[str, int]],
    client: dict[str, str],
) -> tuple[dict[str, dict[str, int]], dict[str, Any]]:
    """(the Kafka source's offsets from which to read ``offsets:`` or ``timestamp:``, what
    the event log records of them). Partitions ``offsets:`` does not name keep the offsets
    the checkpoint holds; ``offsets:earliest`` is every partition's earliest retained one.
    Refused when a partition's offset is below its earliest retained one (the broker
    deleted those records)."""
    if replay.kind not in ("offsets", "timestamp"):
        raise replay.refused("the flow reads Kafka: give offsets: or timestamp:")
    servers, topics, pattern = source["servers"], source["topics"], source["pattern"]
    ranges = kafkabroker.retained(servers, topics, pattern, client)
    if replay.kind == "timestamp":
        millis = int(replay.value.timestamp() * 1000)
        wanted = kafkabroker.at_time(servers, ranges, millis, client)
        # The first record at or after the time is the earliest retained one: the records
        # deleted before it may have been later than the time too.
        gone = [tp for tp, at in wanted.items() if at == ranges[tp][0] > 0]
        why = "its earliest retained record is the first at or after that time, and older "
        why += "ones were deleted"
    elif replay.value == EARLIEST:
        wanted, gone, why = {tp: low for tp, (low, _) in ranges.items()}, [], ""
    else:
        wanted = {
            (t, int(p)): int(o) for t, parts in replay.value.items() for p, o in parts.items()
        }
        unknown = [f"{t}[{p}]" for t, p in wanted if (t, p) not in ranges]
        if unknown:
            raise replay.refused(f"the source has no partition {', '.join(unknown)}")
        past = [
            f"{t}[{p}] ends at {ranges[t, p][1]}"
            for (t, p), o in wanted.items()
            if o > ranges[t, p][1]
        ]
        if past:
            raise replay.refused("; ".join(past))
        gone = [tp for tp, at in wanted.items() if at < ranges[tp][0]]
        why = "retention deleted the records before each one's earliest retained offset"
    if gone:
        earliest = {t: {str(p): ranges[t, p][0]} for t, p in gone}
        raise ReplayBeyondRetentionError(
            flow=replay.flow,
            dataset=dataset,
            position=replay.position,
            source=f"Kafka {servers}",
            why=f"{', '.join(f'{t}[{p}]' for t, p in gone)}: {why}",
            oldest="offsets:" + json.dumps(earliest),
        )
    ahead = [
        f"{t}[{p}] to {at} (the flow is at {offset.get(t, {}).get(str(p))})"
        for (t, p), at in wanted.items()
        if str(p) in offset.get(t, {}) and at > offset[t][str(p)]
    ]
    if ahead:  # it would skip the records in between
        raise replay.refused(f"it moves {', '.join(ahead)} ahead: a replay goes back")
    rewound = {t: dict(parts) for t, parts in offset.items()}
    for (topic, partition), at in wanted.items():
        rewound.setdefault(topic, {})[str(partition)] = at
    return rewound, {"offsets": rewound}


def watermark(
    replay: Replay, source: Extraction, stored: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(a WATERMARK extraction flow's checkpoint moved back to ``watermark:`` and what the
    event log records of it). The columns named take the values given (null: from the
    first value, as the first run reads), the others keep theirs. A table holds its rows'
    state now, so every watermark is within what it holds: a run reads the rows changed
    since, as they are now."""
    if replay.kind != "watermark":
        raise replay.refused(
            f"the flow reads the extraction source {source.name}: give "
            'watermark:{"column": value}'
        )
    orders = {o.column: o for o in source.cdc_order}
    unknown = [c for c in replay.value if c not in orders]
    if unknown:
        raise replay.refused(
            f"{unknown} are not cdc_order columns of {source.name} ({', '.join(orders)})"
        )
    moved = dict(stored)
    for column, value in replay.value.items():
        held = stored.get(column)
        if value is not None and held is not None:
            if isinstance(value, str) != isinstance(held, str):
                raise replay.refused(f"{column} holds values such as {held!r}, not {value!r}")
            if orders[column].further(held, value) != held:
                raise replay.refused(
                    f"{column} {value!r} is ahead of the flow (at {held!r}): a replay goes back"
                )
        moved[column] = value
    return moved, {"watermark": moved}


def append_batch(checkpoint: Path, batch: int, ends: list[dict[str, Any]]) -> None:
    """Note, then write, micro-batch ``batch + 1``: committed, ending at ``ends``."""
    head = (checkpoint / "offsets" / str(batch)).read_text().splitlines()[:2]  # version, conf
    offsets = "\n".join([*head, *(json.dumps(e, separators=(",", ":")) for e in ends)])
    commit = (checkpoint / "commits" / str(batch)).read_text()
    note = {"batch": batch + 1, "offsets": offsets, "commit": commit}
    write_atomically(checkpoint / NOTE, json.dumps(note))
    finish(checkpoint)


def finish(checkpoint: Path) -> None:
    """Write the micro-batch a replay noted in ``checkpoint`` (if any), then drop the note:
    again and again alike, so a kill anywhere in it is made good by the next start."""
    note = checkpoint / NOTE
    try:
        noted = json.loads(note.read_text())
    except FileNotFoundError:
        return
    for log, text in (("offsets", noted["offsets"]), ("commits", noted["commit"])):
        written = checkpoint / log / str(noted["batch"])
        written.with_name(f".{written.name}.crc").unlink(missing_ok=True)  # Hadoop's checksum
        write_atomically(written, text)
    note.unlink()
