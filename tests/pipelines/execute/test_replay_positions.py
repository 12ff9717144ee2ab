"""A replay's position, without Spark: how ``--replay-from`` is read, the offset each kind
of source gets (a Delta table's from its ``_delta_log``, Kafka's from the broker's
retained offsets), what is refused beyond retention, and the rewound micro-batch a kill
leaves noted in the checkpoint."""

from __future__ import annotations

import json
import os
import time
from datetime import datetime, timezone
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from autocdc.pipelines import cli
from autocdc.pipelines.errors import ReplayBeyondRetentionError, ReplayPositionError
from autocdc.pipelines.execute import position as pos
from autocdc.pipelines.execute import replay
from autocdc.sources.extract import Extraction

DELTA_OFFSET = {
    "sourceVersion": 1,
    "reservoirId": "a1b2",
    "reservoirVersion": 4,
    "index": 0,
    "isStartingVersion": False,
}


@pytest.mark.parametrize(
    ("given", "kind", "value"),
    [
        ("orders=version:12", "version", 12),
        (" orders = VERSION: 0", "version", 0),
        (
            "o=timestamp:2026-01-31T08:00:00Z",
            "timestamp",
            datetime(2026, 1, 31, 8, tzinfo=timezone.utc),
        ),
        (
            "o=timestamp:2026-01-31 08:00",
            "timestamp",
            datetime(2026, 1, 31, 8, tzinfo=timezone.utc),
        ),
        ('o=offsets:{"t":{"0":5,"1":0}}', "offsets", {"t": {"0": 5, "1": 0}}),
        ("o=offsets:earliest", "offsets", "earliest"),
        ("o=lsn:16/B374D848", "lsn", (0x16 << 32) | 0xB374D848),
        ('o=watermark:{"v":1.50,"at":null}', "watermark", {"v": Decimal("1.50"), "at": None}),
    ],
)
def test_a_position_is_read_with_its_kind(given, kind, value):
    parsed = replay.parse(given)
    assert (parsed.flow, parsed.kind, parsed.value) == (given.split("=")[0].strip(), kind, value)


@pytest.mark.parametrize(
    "given",
    [
        "orders",
        "orders=",
        "=version:3",
        "orders=version:-1",
        "orders=version:x",
        "orders=lsn:16",
        "orders=watermark:3",
        "orders=timestamp:yesterday",
        'orders=offsets:{"t":{"p":5}}',
        'orders=offsets:{"t":5}',
        "orders=offsets:[1]",
        'orders=watermark:{"a":[1]}',
    ],
)
def test_a_position_that_cannot_be_read_is_refused(given):
    with pytest.raises(ReplayPositionError) as refused:
        replay.parse(given)
    assert refused.value.params["given"] == given


def test_the_cli_takes_replay_from():
    args = cli._parser().parse_args(["run", "--replay-from", "orders=version:3"])
    assert args.replay_from == replay.parse("orders=version:3")
    with pytest.raises(SystemExit):
        cli._parser().parse_args(["run", "--replay-from", "orders=nowhere:3"])


def _table(root: Path, commits: list[list[str]], start: int = 0) -> Path:
    """A Delta table's log: commit ``start + i`` adds the files ``commits[i]`` (written
    too), stamped one second apart from 2026-01-01T00:00:00Z."""
    (root / "_delta_log").mkdir(parents=True)
    base = datetime(2026, 1, 1, tzinfo=timezone.utc).timestamp()
    for i, files in enumerate(commits):
        version = start + i
        actions = [{"commitInfo": {"operation": "WRITE"}}]
        for name in files:
            (root / name).write_text("data")
            actions.append({"add": {"path": name, "dataChange": True}})
        commit = root / "_delta_log" / f"{version:020d}.json"
        commit.write_text("\n".join(json.dumps(a) for a in actions) + "\n")
        os.utime(commit, (base + version, base + version))  # Delta's time: the file's
    return root


def _delta(table: Path, given: str) -> tuple[dict, dict]:
    source = {"kind": "delta", "path": str(table)}
    return replay.delta(replay.parse(given), "orders", source, DELTA_OFFSET)


def test_a_delta_version_becomes_the_offset_before_its_first_file(tmp_path):
    table = _table(tmp_path / "t", [[], ["a.parquet"], ["b.parquet"], ["c.parquet"]])
    offset, said = _delta(table, "f=version:2")
    assert offset == {**DELTA_OFFSET, "reservoirVersion": 2, "index": -1}
    assert said == {"version": 2}
    # A time between two commits: the first version committed at or after it.
    offset, _ = _delta(table, "f=timestamp:2026-01-01T00:00:01.500Z")
    assert offset["reservoirVersion"] == 2
    assert _delta(table, "f=timestamp:2025-12-31T00:00:00Z")[0]["reservoirVersion"] == 0


@pytest.mark.parametrize(
    "given", ["f=version:4", "f=timestamp:2026-01-02T00:00:00Z", "f=offsets:earliest"]
)
def test_a_delta_position_past_the_table_or_of_another_kind_is_refused(tmp_path, given):
    table = _table(tmp_path / "t", [[], ["a.parquet"], ["b.parquet"], ["c.parquet"]])
    with pytest.raises(ReplayPositionError):
        _delta(table, given)


def test_a_position_ahead_of_the_flow_is_refused(tmp_path, broker):
    """It would skip the changes in between: a replay only goes back."""
    table = _table(tmp_path / "t", [[], ["a.parquet"], ["b.parquet"], ["c.parquet"]])
    source = {"kind": "delta", "path": str(table)}
    at_two = {**DELTA_OFFSET, "reservoirVersion": 2}
    with pytest.raises(ReplayPositionError):
        replay.delta(replay.parse("f=version:3"), "orders", source, at_two)
    assert replay.delta(replay.parse("f=version:2"), "orders", source, at_two)[1] == {"version": 2}
    with pytest.raises(ReplayPositionError):
        _kafka('f=offsets:{"t":{"0":45}}')  # the flow is at 40


def test_a_delta_version_whose_files_were_vacuumed_is_refused_naming_the_oldest(tmp_path):
    table = _table(tmp_path / "t", [[], ["a.parquet"], ["b.parquet"], ["c.parquet"]])
    (table / "a.parquet").unlink()  # removed by a later commit, then VACUUM
    with pytest.raises(ReplayBeyondRetentionError) as refused:
        _delta(table, "f=version:1")
    assert refused.value.params["oldest"].startswith("version:2 ")
    assert refused.value.params["flow"] == "f"
    assert _delta(table, "f=version:2")[0]["reservoirVersion"] == 2


def test_a_delta_time_before_a_cleaned_up_log_is_refused(tmp_path):
    """Commits 0 and 1 were cleaned up: a time before commit 2 may fall in them."""
    table = _table(tmp_path / "t", [["b.parquet"], ["c.parquet"]], start=2)
    with pytest.raises(ReplayBeyondRetentionError):
        _delta(table, "f=timestamp:2026-01-01T00:00:00Z")
    with pytest.raises(ReplayBeyondRetentionError):
        _delta(table, "f=version:1")
    assert _delta(table, "f=timestamp:2026-01-01T00:00:02.5Z")[0]["reservoirVersion"] == 3


def _change_table(root: Path, commits: list[list[str]], start: int = 0) -> Path:
    """A PostgreSQL capture's change table: commit ``start + i`` adds one file of rows at
    the LSNs ``commits[i]``."""
    _table(root, [[f"part-{i}.parquet"] if lsns else [] for i, lsns in enumerate(commits)], start)
    for i, lsns in enumerate(commits):
        if lsns:
            frame = pa.table({"table": ["public.t"] * len(lsns), "lsn": lsns})
            pq.write_table(frame, root / f"part-{i}.parquet")
    return root


def test_an_lsn_is_the_first_version_of_the_change_table_that_reaches_it(tmp_path):
    """Versions 1..3 hold rows at LSNs 0/10..0/1F, 0/20..0/2F, 1/0 (a later segment, which
    text order would put first): an LSN is read from the version holding it, or the
    first after it."""
    table = _change_table(tmp_path / "t", [[], ["0/10", "0/1F"], ["0/20", "0/2F"], ["1/0"]])
    assert _delta(table, "f=lsn:0/1F")[0]["reservoirVersion"] == 1
    assert _delta(table, "f=lsn:0/20")[0]["reservoirVersion"] == 2
    assert _delta(table, "f=lsn:0/30")[0]["reservoirVersion"] == 3
    assert _delta(table, "f=lsn:0/1")[0]["reservoirVersion"] == 1  # before the capture: all
    with pytest.raises(ReplayPositionError):
        _delta(table, "f=lsn:1/1")
    plain = _table(tmp_path / "plain", [["a.parquet"]])
    pq.write_table(pa.table({"id": [1]}), plain / "a.parquet")
    with pytest.raises(ReplayPositionError):  # not a change table
        _delta(plain, "f=lsn:0/1")


def test_an_lsn_before_what_the_change_table_still_holds_is_refused(tmp_path):
    """Versions 0 and 1 were cleaned up: an LSN before version 2's rows may lie in them."""
    table = _change_table(tmp_path / "t", [["0/20", "0/2F"], ["1/0"]], start=2)
    with pytest.raises(ReplayBeyondRetentionError) as refused:
        _delta(table, "f=lsn:0/10")
    assert refused.value.params["oldest"].startswith("version:2 ")
    assert _delta(table, "f=lsn:0/20")[0]["reservoirVersion"] == 2


@pytest.fixture
def broker(monkeypatch):
    """A broker with topic t: partition 0 holds offsets 10..50, partition 1 0..7; a
    record stamped at or after time ``millis`` is at offset ``millis`` (clamped)."""
    ranges = {("t", 0): (10, 50), ("t", 1): (0, 7)}
    monkeypatch.setattr(replay.kafkabroker, "retained", lambda *args: ranges)

    def at_time(servers, asked, millis, client):
        return {tp: min(max(millis, low), high) for tp, (low, high) in asked.items()}

    monkeypatch.setattr(replay.kafkabroker, "at_time", at_time)
    return ranges


def _kafka(given: str) -> tuple[dict, dict]:
    source = {"kind": "kafka", "servers": "b:9092", "topics": ["t"], "pattern": None}
    return replay.kafka(replay.parse(given), "orders", source, {"t": {"0": 40, "1": 7}}, {})


def test_kafka_offsets_replace_the_partitions_named(broker):
    assert _kafka('f=offsets:{"t":{"0":12}}')[0] == {"t": {"0": 12, "1": 7}}
    assert _kafka("f=offsets:earliest")[0] == {"t": {"0": 10, "1": 0}}
    assert _kafka("f=timestamp:1970-01-01T00:00:00.020Z")[0] == {"t": {"0": 20, "1": 7}}


def test_kafka_offsets_beyond_retention_are_refused_naming_the_earliest(broker):
    with pytest.raises(ReplayBeyondRetentionError) as refused:
        _kafka('f=offsets:{"t":{"0":3}}')
    assert json.loads(refused.value.params["oldest"].removeprefix("offsets:")) == {"t": {"0": 10}}
    with pytest.raises(ReplayBeyondRetentionError):  # partition 0's first record is its earliest
        _kafka("f=timestamp:1970-01-01T00:00:00.001Z")
    for given in ('f=offsets:{"t":{"2":0}}', 'f=offsets:{"t":{"1":8}}', "f=version:3"):
        with pytest.raises(ReplayPositionError):
            _kafka(given)


def _checkpoint(root: Path) -> Path:
    """A checkpoint whose micro-batch 3 is committed (reading one Delta source)."""
    for log, text in (
        ("offsets", 'v1\n{"batchWatermarkMs":0,"conf":{}}\n' + json.dumps(DELTA_OFFSET)),
        ("commits", 'v1\n{"nextBatchWatermarkMs":0}'),
    ):
        (root / log).mkdir(parents=True)
        (root / log / "3").write_text(text)
        (root / log / ".3.crc").write_text("x")
    return root


def test_a_rewind_is_a_committed_batch_ending_at_the_position(tmp_path):
    checkpoint = _checkpoint(tmp_path / "cp")
    rewound = {**DELTA_OFFSET, "reservoirVersion": 1, "index": -1}
    replay.append_batch(checkpoint, 3, [rewound])
    assert pos.committed(checkpoint) == 4
    assert pos.offsets(checkpoint, 4) == [rewound]
    assert (checkpoint / "offsets" / "4").read_text().startswith('v1\n{"batchWatermarkMs":0,')
    assert not (checkpoint / replay.NOTE).exists()


def test_a_rewind_a_kill_interrupted_is_finished_by_the_next_start(tmp_path):
    """Killed after the note, with batch 4's offsets written and not its commit (and a
    stale offsets file a crashed run left): the next start writes both again."""
    checkpoint = _checkpoint(tmp_path / "cp")
    rewound = {**DELTA_OFFSET, "reservoirVersion": 1, "index": -1}
    head = "v1\n{}\n"
    note = {"batch": 4, "offsets": head + json.dumps(rewound), "commit": "v1\n{}"}
    (checkpoint / replay.NOTE).write_text(json.dumps(note))
    (checkpoint / "offsets" / "4").write_text(head + json.dumps(DELTA_OFFSET))
    (checkpoint / "offsets" / ".4.crc").write_text("stale")
    replay.finish(checkpoint)
    assert pos.committed(checkpoint) == 4
    assert pos.offsets(checkpoint, 4) == [rewound]
    assert not (checkpoint / "offsets" / ".4.crc").exists()
    assert not (checkpoint / replay.NOTE).exists()
    before = time.time()
    replay.finish(checkpoint)  # nothing noted: nothing written
    assert (checkpoint / "commits" / "4").stat().st_mtime <= before


def test_a_watermark_moves_the_named_columns_back():
    source = Extraction(
        name="s", dsn="dbname=x", table="t", cdc_order=["updated_at", "version DESC"]
    )
    stored = {"updated_at": "2026-01-01 08:00:00", "version": 5}

    def moved(given: str) -> dict:
        return replay.watermark(replay.parse(f"f=watermark:{given}"), source, stored)[0]

    assert moved('{"updated_at": "2026-01-01 07:00:00"}') == {
        "updated_at": "2026-01-01 07:00:00",
        "version": 5,
    }
    assert moved('{"version": 9, "updated_at": null}') == {"updated_at": None, "version": 9}
    for given in (
        '{"version": 3}',  # descending: a smaller version is ahead
        '{"updated_at": "2026-01-02 00:00:00"}',
        '{"updated_at": 5}',
        '{"nope": 1}',
    ):
        with pytest.raises(ReplayPositionError):
            moved(given)
    with pytest.raises(ReplayPositionError):
        replay.watermark(replay.parse("f=version:3"), source, stored)
