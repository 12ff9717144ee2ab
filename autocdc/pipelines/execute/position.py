"""Where a streaming flow stands: its sources, the offsets its checkpoint reached, its lag.

All of it is driver-side and cheap, with no Spark job over user data: the query's plan
names the sources, the checkpoint's offset log and file-source log say what was read,
and a listing of the source folder (or of a source Delta table's ``_delta_log``, or a
Kafka broker's end offsets) says what there is. Other sources have no lag (None).
"""

from __future__ import annotations

import itertools
import json
import re
import time
from dataclasses import asdict, dataclass
from glob import has_magic
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, urlparse

from pyspark.sql import DataFrame

from autocdc.sources import kafkabroker, kafkaclient

FILE_FORMATS = {"json", "csv", "parquet", "orc", "text", "avro", "xml", "binaryfile"}
_COMMIT = re.compile(r"^(\d{20})\.json$")


@dataclass(frozen=True)
class Lag:
    """Input not processed yet: files and bytes (file sources), versions (Delta sources),
    records (Kafka sources), and the age of the oldest of it. None where the sources
    cannot tell."""

    files: int | None = None
    bytes: int | None = None
    versions: int | None = None
    records: int | None = None
    oldest_age_seconds: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _local(uri: str, root: Path) -> Path | None:
    """A local path from ``file:/x``, ``file:///x`` or a plain path (relative to root)."""
    parsed = urlparse(uri)
    if parsed.scheme not in ("", "file"):
        return None
    return root / unquote(parsed.path) if parsed.scheme else root / uri


def sources(df: DataFrame, root: Path) -> list[dict[str, Any]]:
    """The streaming sources of ``df`` in the order Spark numbers them in the checkpoint:
    ``{"kind": "files" | "delta" | "kafka" | "other", "path": str | None}``, a Kafka
    source with its ``servers`` and ``topics`` or ``pattern`` (never its other client
    options, which may hold credentials). Relative paths are the project's (``root``), as
    the runner has Spark resolve them; a path inside the project is also given relative
    to it (``project_path``), so that a copied or moved project is read where it is now."""
    found: list[dict[str, Any]] = []
    leaves = df._jdf.queryExecution().analyzed().collectLeaves().iterator()
    while leaves.hasNext():
        leaf = leaves.next()
        if leaf.nodeName() == "StreamingRelation":
            data_source = leaf.dataSource()
            fmt = data_source.className().lower()
            options = data_source.options()
            given = options.get("path")
            location = _local(given.get(), root) if given.isDefined() else None
            kind = "delta" if "delta" in fmt else "files" if fmt in FILE_FORMATS else "other"
            found.append({"kind": kind, "path": str(location) if location else None})
            if location is not None and location != root and location.is_relative_to(root):
                found[-1]["project_path"] = str(location.relative_to(root))
        elif leaf.nodeName() == "StreamingRelationV2" and leaf.sourceName() == "kafka":
            found.append(_kafka(leaf.extraOptions()))
        elif leaf.nodeName().startswith("StreamingRelation"):
            found.append({"kind": "other", "path": None})
    return found


def _kafka(options: Any) -> dict[str, Any]:
    """A Kafka source from its options (a case-insensitive Java map). A secured one keeps
    its securing options as declared (``client``: placeholders, never a secret), from
    which the lag is asked, in the run and in ``autocdc status``."""
    subscribed, assigned = options.get("subscribe"), options.get("assign")
    topics = [t.strip() for t in subscribed.split(",")] if subscribed else None
    if assigned:
        topics = sorted(json.loads(assigned))
    found = {
        "kind": "kafka",
        "path": None,
        "servers": options.get("kafka.bootstrap.servers"),
        "topics": topics,
        "pattern": options.get("subscribePattern"),
    }
    declared = options.get(kafkaclient.RECORD_OPTION)
    if declared:
        found["client"] = json.loads(declared)
    else:  # a reader of the user's own: its secrets are values, so they are left out
        names = [str(n) for n in options.keySet().toArray()]
        client = kafkaclient.recorded({n: options.get(n) for n in names})
        if client:
            found["client"] = client
    return found


def committed(checkpoint: Path) -> int | None:
    """The id of the last micro-batch the checkpoint records as done."""
    ids = [int(p.name) for p in (checkpoint / "commits").glob("*") if p.name.isdigit()]
    return max(ids, default=None)


def offsets(checkpoint: Path, batch_id: int | None) -> list[dict[str, Any] | None]:
    """The end offset of each source for micro-batch ``batch_id`` (Spark's offset log:
    a version line, the batch's metadata, then one line per source, ``-`` for none)."""
    if batch_id is None:
        return []
    log = checkpoint / "offsets" / str(batch_id)
    if not log.is_file():
        return []
    lines = log.read_text().splitlines()[2:]
    return [None if line.strip() == "-" else json.loads(line) for line in lines]


def position(found: list[dict[str, Any]], ends: list[dict[str, Any] | None]) -> list[dict]:
    """The JSON ``source_position`` of the event log: each source with its end offset."""
    return [
        {**source, "offset": ends[i] if i < len(ends) else None} for i, source in enumerate(found)
    ]


def _visible(path: Path, top: Path) -> bool:
    """Spark's file index skips names starting with ``_`` or ``.`` (below the source)."""
    return not any(part.startswith(("_", ".")) for part in path.relative_to(top).parts)


def _listing(location: Path) -> list[Path]:
    if has_magic(str(location)):
        return sorted(p for p in Path("/").glob(str(location).lstrip("/")) if p.is_file())
    if location.is_file():
        return [location]
    return sorted(p for p in location.rglob("*") if p.is_file() and _visible(p, location))


def _source_logs(folder: Path) -> list[Path]:
    """A file source's log files (``sources/<i>/<batch>[.compact]``), in batch order."""
    logs = [p for p in folder.glob("*") if p.name.split(".")[0].isdigit()]
    return sorted(logs, key=lambda p: int(p.name.split(".")[0]))


def _processed_files(log: Path, up_to: int) -> set[Path]:
    """Files of a file source's checkpoint log (``sources/<i>/``) read by micro-batches
    up to source batch ``up_to``; from the last compaction on (it holds all before it)."""
    names = _source_logs(log)
    compacts = [int(p.name.split(".")[0]) for p in names if p.name.endswith(".compact")]
    start = max(compacts, default=0)
    seen: set[Path] = set()
    for entry in names:
        if int(entry.name.split(".")[0]) < start:
            continue
        for line in entry.read_text().splitlines()[1:]:
            record = json.loads(line)
            if record["batchId"] <= up_to:
                seen.add(Path(unquote(urlparse(record["path"]).path)))
    return seen


def _base(location: Path) -> Path:
    """The folder a file source lists: its path up to the first glob character."""
    parts = location.parts
    plain = list(itertools.takewhile(lambda p: not has_magic(p), parts))
    return Path(*plain) if plain else location


def elsewhere(found: list[dict[str, Any]], checkpoint: Path) -> tuple[Path, Path] | None:
    """(a folder the checkpoint recorded files in, the source's location now) for the first
    file source whose checkpoint log names files outside where the source now reads: a
    project copied or moved (Spark keeps absolute paths), or a source's path changed."""
    for i, source in enumerate(found):
        if source["kind"] != "files" or not source["path"]:
            continue
        latest = next(reversed(_source_logs(checkpoint / "sources" / str(i))), None)
        lines = latest.read_text().splitlines()[1:] if latest else []
        if not lines:
            continue
        recorded = Path(unquote(urlparse(json.loads(lines[0])["path"]).path))
        location = Path(source["path"])
        if not recorded.is_relative_to(_base(location)):
            return recorded.parent, location
    return None


def moved_with_project(recorded: Path, location: Path, root: Path) -> Path | None:
    """The project's old root, when ``recorded`` (a folder a checkpoint read files in) is
    where ``location`` (the source now, inside the project at ``root``) was before the whole
    project moved; else None (the source moved on its own, or lies outside the project)."""
    base = _base(location)
    if not base.is_relative_to(root) or base == root:
        return None
    inside = base.relative_to(root).parts
    for folder in [recorded, *recorded.parents]:
        if folder.parts[-len(inside) :] == inside:
            old = Path(*folder.parts[: -len(inside)])
            return old if old != root else None
    return None


def translate(checkpoint: Path, old: Path, new: Path) -> int:
    """Rename, in the file-source logs of ``checkpoint``, the files read under ``old`` to
    the same files under ``new``; returns how many logs were rewritten. Each log is
    replaced whole, the latest last (a run killed midway finds it untranslated and
    translates again; entries already under ``new`` are left as they are), and its
    checksum file goes with it (Hadoop reads a log that has none without checking)."""
    logs = [log for source in (checkpoint / "sources").glob("*") for log in _source_logs(source)]
    rewritten = 0
    for log in logs:
        lines, changed = log.read_text().split("\n"), False
        for i, line in enumerate(lines[1:], start=1):
            if not line.strip():
                continue
            record = json.loads(line)
            url = urlparse(record["path"])
            local = Path(unquote(url.path))
            if local.is_relative_to(old):
                moved = quote(str(new / local.relative_to(old)))
                record["path"] = url._replace(path=moved).geturl()
                lines[i], changed = json.dumps(record, separators=(",", ":")), True
        if changed:
            partial = log.with_name(f".{log.name}.moving")
            partial.write_text("\n".join(lines))
            partial.replace(log)
            log.with_name(f".{log.name}.crc").unlink(missing_ok=True)
            rewritten += 1
    return rewritten


def delta_versions(table: Path) -> list[int]:
    logs = table / "_delta_log"
    return sorted(int(m[1]) for p in logs.glob("*.json") if (m := _COMMIT.match(p.name)))


def _moved(source: dict[str, Any], root: Path | None) -> tuple[Path, Path] | None:
    """(where a source inside the project was recorded, where it is now) when the project
    at ``root`` was copied or moved since (its checkpoints still name the old files)."""
    inside = source.get("project_path")
    if root is None or inside is None:
        return None
    recorded, now = Path(source["path"]), root / inside
    return (recorded, now) if recorded != now else None


def lag(
    found: list[dict[str, Any]],
    ends: list[dict[str, Any] | None],
    checkpoint: Path,
    root: Path | None = None,
) -> Lag:
    """What the sources hold beyond offsets ``ends`` (one per source, as in ``offsets``);
    sources inside the project are read where the project is now, at ``root`` if given."""
    files = size = versions = records = None
    oldest: float | None = None
    now = time.time()
    for i, source in enumerate(found):
        end = ends[i] if i < len(ends) else None
        if source["kind"] == "kafka":
            client = kafkaclient.askable(source.get("client"))
            waiting = None
            if client is not None:  # else a secret written as it is: the lag is unknown
                waiting = kafkabroker.behind(
                    source["servers"], end, source["topics"], source["pattern"], client
                )
            if waiting is not None:
                records = (records or 0) + waiting.records
                if waiting.oldest_age_seconds is not None:
                    oldest = max(waiting.oldest_age_seconds, oldest or 0.0)
            continue
        location = Path(source["path"]) if source["path"] else None
        if location is None:
            continue
        moved = _moved(source, root)
        if moved:
            location = moved[1]
        if source["kind"] == "files":
            up_to = end["logOffset"] if end else -1
            done = _processed_files(checkpoint / "sources" / str(i), up_to)
            if moved:  # the same files, where the project is now
                old, new = _base(moved[0]), _base(moved[1])
                done = {new / p.relative_to(old) if p.is_relative_to(old) else p for p in done}
            waiting = [p for p in _listing(location) if p not in done]
            stats = [p.stat() for p in waiting]
            files = (files or 0) + len(waiting)
            size = (size or 0) + sum(s.st_size for s in stats)
            ages = [now - s.st_mtime for s in stats]
        elif source["kind"] == "delta":
            known = delta_versions(location)
            if not known:
                continue
            # Delta's offset (v, index -1) means: nothing of version v read yet.
            done_through = -1 if end is None else end["reservoirVersion"] - (end["index"] == -1)
            behind = [v for v in known if v > done_through]
            versions = (versions or 0) + max(0, known[-1] - done_through)
            first = location / "_delta_log" / f"{behind[0]:020d}.json" if behind else None
            ages = [now - first.stat().st_mtime] if first else []
        else:
            continue
        if ages:
            oldest = max(ages + ([oldest] if oldest is not None else []))
    return Lag(
        files=files, bytes=size, versions=versions, records=records, oldest_age_seconds=oldest
    )


def lag_now(found: list[dict[str, Any]], checkpoint: Path, root: Path) -> Lag:
    """The lag of a flow at rest: against the last micro-batch its checkpoint committed,
    its sources inside the project read where the project is now (``root``)."""
    return lag(found, offsets(checkpoint, committed(checkpoint)), checkpoint, root)
