"""The status page: gathered from real tables, rendered, and opened in headless Chromium.

The event log is written by hand to its contract (its writer lives elsewhere); the SCD
type 2 target and its quarantine come from the engine itself.
"""

from __future__ import annotations

import argparse
import html
import json
import os
import re
import shutil
import sys
import uuid
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from autocdc import AutoCdcFlow
from autocdc.pipelines.declare import project as projects
from autocdc.pipelines.execute import eventlog
from autocdc.pipelines.operations.report import add_arguments, key_pair, write_report
from autocdc.pipelines.operations.report_html import (
    Batch,
    FlowStatus,
    Page,
    Quarantine,
    ReportDependencyError,
    Timeline,
    record,
    render,
)

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
CHANGES = "id INT, name STRING, city STRING, op STRING, seq BIGINT, _corrupt_record STRING"
# A change event the source could not map, kept as its raw text by the engine.
EVENT = '{"op":"c","after":{"id":9,"name":"Tom & \\"Jerry\\" <x>"}}'


def _project(tmp_path: Path, name: str) -> projects.Project:
    spec = tmp_path / name / "spark-pipeline.yml"
    spec.parent.mkdir()
    spec.write_text(f"name: {name}\nstorage: storage\n")
    return projects.load(spec)


def _event(when: datetime, kind: str, flow: str | None, target: str | None, **values) -> tuple:
    row = {"run_id": "r1", "pipeline": "shop", "event_time": when, "event_type": kind}
    row |= {"flow": flow, "target": target, "host": "h", "pid": 1, **values}
    return tuple(row.get(field.name) for field in eventlog.SCHEMA.fields)


def _events(customers: str, orders: str) -> list[tuple]:
    """Twelve batches of customers_cdc (two with an unknown lag), one error, and one
    batch of a flow whose target is gone."""
    start = datetime(2026, 11, 30, 9, 0)
    rows_in = [120, 95, 140, 130, 80, 60, 150, 110, 90, 100, 70, 40]
    lag_files = [11, 9, 10, 8, 6, 5, 5, 4, 2, 3, 1, 0]
    lag_seconds = [620.0, 540.0, 610.0, 480.0, 400.0, None, None, 300.0, 180.0, 240.0, 90.0, 20.0]
    rows = [_event(start, "run_started", None, None)]
    for i in range(12):
        rows.append(
            _event(
                start + timedelta(minutes=i + 1),
                "batch",
                "customers_cdc",
                customers,
                batch_id=i + 1,
                rows_in=rows_in[i],
                upserted=rows_in[i] - 12 - i % 4,
                deleted=8 + i % 4,
                quarantined=4 if i == 3 else 0,
                seconds=1.5,
                lag_files=lag_files[i],
                lag_seconds=lag_seconds[i],
            )
        )
    failed = start + timedelta(minutes=14)
    rows.append(
        _event(failed, "error", "customers_cdc", customers, error_class="X", message="<boom>")
    )
    rows.append(_event(start, "batch", "orders_cdc", orders, batch_id=1, rows_in=3, upserted=3))
    return rows


@pytest.fixture(scope="module")
def shop(spark, tmp_path_factory):
    """A project whose event log names two flows: an SCD2 target with versions of key
    id=5, two NULL-key rows and a malformed event in quarantine, and a flow whose target
    does not exist.
    Module-scoped (two engine batches cost seconds), so the names are its own."""
    suffix = uuid.uuid4().hex[:8]
    customers, orders = f"customers_{suffix}", f"orders_{suffix}"
    flow = AutoCdcFlow(
        target=customers,
        name="customers_cdc",
        keys=["id"],
        sequence_by="seq",
        apply_as_deletes="op = 'D'",
        except_column_list=["op", "seq", "_corrupt_record"],
        stored_as_scd_type=2,
    )
    flow.apply(
        spark.createDataFrame(
            [
                (5, "Ann", "Oslo", "U", 1, None),
                (5, "Ann", "Rome", "U", 3, None),
                (7, "Bob", "Lima", "U", 2, None),
                (None, "Nil", "Oslo", "U", 4, None),
                (None, "<script>alert(1)</script>", "Oslo", "U", 5, None),
                (5, "Ann", "Rome", "D", 6, None),
                (None, None, None, None, 7, EVENT),
            ],
            CHANGES,
        )
    )
    project = _project(tmp_path_factory.mktemp("report"), "shop")
    log = spark.createDataFrame(_events(customers, orders), eventlog.SCHEMA)
    log.write.format("delta").save(str(project.storage_path / "event_log"))
    return project, customers


def test_key_pair_escaping_and_missing_matplotlib(monkeypatch):
    assert key_pair("id=5") == ("id", "5")
    assert key_pair(" region =a=b") == ("region", "a=b")
    with pytest.raises(argparse.ArgumentTypeError, match="AUTOCDC_REPORT_INVALID_KEY"):
        key_pair("id")
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--out", "site", "--key", "region=eu", "--key", "id=5"])
    assert (args.spec, args.out, args.key) == (None, Path("site"), [("region", "eu"), ("id", "5")])
    evil = "<script>alert(1)</script>"
    page = Page(
        pipeline=evil,
        generated_at=datetime(2026, 1, 1),
        event_log="/x",
        event_log_found=False,
        key={},
        flows=[
            FlowStatus(
                flow=evil,
                target="t",
                target_exists=True,
                scd2=False,
                batches=None,
                last_error=None,
                quarantine=Quarantine(
                    table="t__autocdc_quarantine",
                    reasons=[(evil, 1)],
                    samples=[
                        {
                            "quarantined_at": None,
                            "batch_id": 1,
                            "reason": evil,
                            "sequence": evil,
                            "row": evil,
                        }
                    ],
                ),
                timeline=None,
            )
        ],
    )
    html = render(page)
    assert "<script" not in html
    # <title>, <h1>, contents, data-flow, <h2>, reasons, and the sample's reason,
    # sequence and row: each shown, escaped
    assert html.count("&lt;script&gt;alert(1)&lt;/script&gt;") == 9
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed
    with pytest.raises(ReportDependencyError):
        render(page)


def _page(*flows: FlowStatus) -> Page:
    return Page("shop", datetime(2026, 12, 1), "/log", True, {}, list(flows))


def _flow(name: str, batches: list[Batch] | None, quarantine: Quarantine | None) -> FlowStatus:
    return FlowStatus(name, f"db.{name}", True, False, batches, None, quarantine, None)


def _batches(count: int, no_lag: set[int], no_seconds: set[int]) -> list[Batch]:
    start = datetime(2026, 11, 30, 9, 0)
    return [
        Batch(
            event_time=start + timedelta(minutes=i),
            batch_id=i + 1,
            rows_in=10 + i,
            upserted=8 + i,
            deleted=1,
            quarantined=i % 2,
            seconds=None if i in no_seconds else 1.0 + i,
            lag_files=None if i in no_lag else count - i,
            lag_seconds=None if i in no_lag else 60.0 * (count - i),
        )
        for i in range(count)
    ]


def _svg_points(page: str, gid: str) -> int:
    """The markers of the line drawn with SVG id ``gid`` (up to the next artist's group)."""
    group = page[page.index(f'<g id="{gid}">') :]
    return group[: group.index("<g id=", 1)].count("<use ")


def test_quarantined_records_are_escaped_once_and_readable():
    """A quarantined row is JSON text; shown as indented JSON, HTML-escaped once, with a
    field that holds a JSON document (a malformed event's text) shown as that document
    instead of JSON inside JSON, every quote backslashed."""
    name = 'Tom & "Jerry" <x>'
    event = '{"op":"c","after":{"id":1,"name":"<b>&amp;</b>"}}'
    row = json.dumps({"_corrupt_record": event, "id": None, "name": name, "note": "{not json"})
    sample = {"quarantined_at": None, "batch_id": 3, "reason": "R", "sequence": None, "row": row}
    quarantine = Quarantine("db.t__autocdc_quarantine", [("R", 1)], [sample])
    page = render(_page(_flow("t", None, quarantine)))

    shown = re.findall(r'<pre class="raw">(.*?)</pre>', page, re.S)
    assert len(shown) == 1
    assert html.unescape(shown[0]) == record(row)
    assert record(row) == (
        "{\n"
        '  "_corrupt_record": {\n'
        '    "op": "c",\n'
        '    "after": {\n'
        '      "id": 1,\n'
        '      "name": "<b>&amp;</b>"\n'
        "    }\n"
        "  },\n"
        '  "id": null,\n'
        '  "name": "Tom & \\"Jerry\\" <x>",\n'
        '  "note": "{not json"\n'
        "}"
    )
    assert "Tom &amp; \\&quot;Jerry\\&quot; &lt;x&gt;" in shown[0]
    assert "&lt;b&gt;&amp;amp;&lt;/b&gt;" in shown[0]  # the data's own "&amp;", escaped once
    assert "&amp;lt;" not in page and "&amp;quot;" not in page
    assert record("not JSON <at all>") == "not JSON <at all>"  # shown as stored


def test_counts_plurals_and_plots_per_batch():
    """One batch: singular, a labelled bar for its rows and its duration, and a note for
    its unknown lag. Twelve batches: a bar each, and the lag and durations they recorded,
    those with none left out and counted."""
    one = _flow("one", _batches(1, no_lag={0}, no_seconds=set()), None)
    reasons = [("AUTOCDC_NULL_KEY", 2), ("AUTOCDC_MALFORMED_RECORD", 1)]
    many = _flow("many", _batches(12, no_lag={5, 6}, no_seconds={3}), Quarantine("q", reasons, []))
    page = render(_page(one, many))
    first, second = page.split('<section class="flow"')[1:]

    assert "1 batch shown, at 2026-11-30 09:00:00." in first
    assert "No batch shown recorded a lag" in first and 'data-plot="lag"' not in first
    assert first.count('id="flow0-rows-upserted-0"') == 1
    assert first.count('id="flow0-duration-seconds-0"') == 1
    assert ">2026-11-30 09:00:00</text>" in first  # the lone batch's time, its only tick
    assert re.search(r">1\.0 s</text>", first)  # its duration, written on its bar

    assert "12 batches shown, the last at 2026-11-30 09:11:00." in second
    for stack in ("upserted", "deleted", "quarantined"):
        assert len(re.findall(rf'id="flow1-rows-{stack}-\d+"', second)) == 12
    assert len(re.findall(r'id="flow1-duration-seconds-\d+"', second)) == 11
    assert "; 1 batch with no recorded duration left out." in second
    assert _svg_points(second, "flow1-lag-lag_files") == 10
    assert _svg_points(second, "flow1-lag-lag_seconds") == 10
    assert "; 2 batches with no recorded lag left out." in second
    assert "age of oldest input (min)" in second  # 12 min at most: minutes, not seconds

    assert "<p>3 rows set aside, for 2 reasons:</p>" in second
    counts = re.findall(r"<tr><td><code>(\w+)</code></td><td class=\"n\">(\d+)</td>", second)
    assert counts == [("AUTOCDC_NULL_KEY", "2"), ("AUTOCDC_MALFORMED_RECORD", "1")]
    assert re.search(r"\b1 batches\b|\b1 rows\b|\b1 reasons\b", page) is None


def _bars_drawn(page: str) -> list[tuple[float, float]]:
    """(x, width) of each version's bar in the page's key timeline."""
    found = re.findall(r'<rect class="version" x="([\d.]+)" y="\d+" width="([\d.]+)"', page)
    return [(float(x), float(width)) for x, width in found]


def test_versions_to_scale_lag_in_steps_and_rows_merged():
    """A key's versions at sequences 1, 3, 100 and on: drawn to scale (97 units wide is
    97/2 times 2 units), the current one open to the right edge; a text sequence has no
    scale: equal bars, in order. The lag holds between batches (a step, not a slope), and
    the rows read that changed nothing by themselves have their own stack."""
    versions = [("1", "3", ["a"]), ("3", "100", ["b"]), ("100", None, ["c"])]
    timeline = Timeline({"id": "1"}, ["v"], versions, [])
    batches = _batches(3, no_lag=set(), no_seconds=set())
    flow = FlowStatus("t", "db.t", True, True, batches, None, None, timeline)
    page = render(_page(flow))
    (x1, w1), (x2, w2), (x3, w3) = _bars_drawn(page)
    assert w2 / w1 == pytest.approx(97 / 2, rel=0.01) and x2 == pytest.approx(x1 + w1, abs=0.1)
    assert x3 + w3 == pytest.approx(750, abs=0.1)  # the current version: to the right edge
    assert "to the scale of the sequence" in page

    texts = [("a", "b", ["x"]), ("b", None, ["y"])]
    flow = FlowStatus(
        "t", "db.t", True, True, batches, None, None, replace(timeline, versions=texts)
    )
    assert {w for _, w in _bars_drawn(render(_page(flow)))} == {355.0}

    line = page[page.index('<g id="flow0-lag-lag_files">') :]
    path = re.search(r'<path d="([^"]+)"', line)
    assert path is not None and path[1].count("L") == 2 * 3 - 2  # 3 samples: 2 steps
    # rows_in = upserted + deleted + quarantined + 1 in _batches: one grey row each
    assert len(re.findall(r'id="flow0-rows-merged-or-stale-\d+"', page)) == 3


def _browser_or_skip():
    """Chromium from Debian and Playwright's Python package; CI must have both."""
    missing = [] if Path(CHROMIUM).exists() else [f"{CHROMIUM} (apt-get install chromium)"]
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        missing.append("playwright (pip install playwright)")
    if missing and os.environ.get("CI"):
        pytest.fail(f"CI needs {', '.join(missing)}")
    if missing:
        pytest.skip(f"no headless browser: {', '.join(missing)}")
    return sync_playwright


@pytest.mark.e2e
def test_report_in_chromium(spark, shop, tmp_path):
    sync_playwright = _browser_or_skip()
    project, _ = shop
    index = write_report(spark, project, tmp_path / "out", {"id": "5"})
    problems: list[str] = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1100, "height": 900})
        page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda error: problems.append(str(error)))
        page.goto(index.as_uri())
        assert page.title() == "autocdc status: shop"
        flows = page.locator("section.flow")
        assert [flows.nth(i).get_attribute("data-flow") for i in range(2)] == [
            "customers_cdc",
            "orders_cdc",
        ]
        cdc = page.locator('section[data-flow="customers_cdc"]')
        for plot in ("rows", "duration", "lag", "timeline"):
            figure = cdc.locator(f'figure[data-plot="{plot}"]')
            assert figure.locator("svg").count() == 1 and figure.is_visible(), plot
        lag = cdc.locator('figure[data-plot="lag"]').inner_text()
        assert lag.endswith("; not recorded, so left out: the age of 2 batches.")
        assert "files not yet processed" in cdc.locator('figure[data-plot="lag"] svg').inner_html()
        assert cdc.locator('figure[data-plot="duration"] svg [id^="flow0-duration-"]').count() == 12
        assert cdc.locator(".error").inner_text().endswith("X <boom>")
        reasons = cdc.locator("table.reasons tr td").all_inner_texts()
        assert reasons == ["AUTOCDC_NULL_KEY", "2", "", "AUTOCDC_MALFORMED_RECORD", "1", ""]
        assert cdc.locator("text=3 rows set aside, for 2 reasons:").is_visible()
        assert cdc.locator("table.samples tr").count() == 4  # header and the three rows
        records = cdc.locator("table.samples pre.raw")
        assert records.nth(0).is_visible()
        texts = records.all_inner_texts()
        assert any('"name": "<script>alert(1)</script>",' in text for text in texts)
        # The event's text as JSON, not a string of JSON with every quote backslashed.
        event = '  "_corrupt_record": {\n    "op": "c",\n    "after": {\n      "id": 9,\n'
        assert any(event + '      "name": "Tom & \\"Jerry\\" <x>"\n' in text for text in texts)
        versions = [
            row.locator("td").all_inner_texts()[1:]
            for row in cdc.locator("table.versions tr").all()[1:]
        ]
        assert versions == [["1", "3", "Ann", "Oslo"], ["3", "6", "Ann", "Rome"]]
        assert cdc.locator("svg rect.version").count() == 2
        orders = page.locator('section[data-flow="orders_cdc"]')
        # Rows only: its batch recorded no duration and no lag; no target, so no timeline.
        assert orders.locator("svg").count() == 1
        assert orders.locator("text=No batch of this flow recorded its duration.").is_visible()
        assert orders.locator("text=No batch shown recorded a lag").is_visible()
        assert orders.locator(".meta").inner_text().startswith("no target table")
        assert "; 1 batch shown, at 2026-11-30 09:00:00." in orders.locator(".meta").inner_text()
        page.screenshot(path=str(tmp_path / "report.png"), full_page=True)
        browser.close()
    assert problems == []
    assert (tmp_path / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    if os.environ.get("AUTOCDC_REPORT_SCREENSHOT"):  # how docs/report.png is made
        shutil.copy(tmp_path / "report.png", os.environ["AUTOCDC_REPORT_SCREENSHOT"])


def test_report_without_event_log(spark, shop, tmp_path):
    """No event log: the CDC targets are found by their state tables, and each section
    says there is no history instead of failing."""
    _, customers = shop
    index = write_report(spark, _project(tmp_path, "bare"), tmp_path / "bare_out")
    html = index.read_text()
    section = html[html.index(f"into <code>{customers}</code></h2>") :]
    section = section[: section.index("</section>")]
    assert "No event log at" in section
    assert 'AUTOCDC_NULL_KEY</code></td><td class="n">2</td>' in section
    assert "Pass --key COLUMN=VALUE" in section
    assert 'data-flow="customers_cdc"' in html  # the flow named by its quarantine rows


def test_a_run_stopped_with_ctrl_c_shows_as_stopped():
    """The page says how the last run ended; one stopped with Ctrl-C reads stopped (by the
    user), not failed."""
    run = {"run_id": "3f2a", "status": "stopped", "started": "2026-12-01T10:00:00Z"}
    run |= {"ended": "2026-12-01T10:00:20Z", "error_class": None}
    page = render(replace(_page(), last_run={**run, "message": "interrupted by the user"}))
    assert (
        "Last run <code>3f2a</code>: stopped (interrupted by the user), started "
        "2026-12-01T10:00:00Z, ended 2026-12-01T10:00:20Z." in page
    )
    assert "Last run" not in render(_page())


def test_staged_changes_and_retries_are_on_the_page():
    """A max_staleness flow's staged changes are not in the table yet: the page says how
    many, how old, and how to apply or read them; a flow started again after failures
    says so with its last cause. Nothing staged: no line."""
    staged = {"batches": 2, "rows": 5, "oldest_age_seconds": 45.2, "last_apply_rows": 0}
    retries = {"count": 2, "last_error_class": "Py4JJavaError", "last_message": "<worker>"}
    flow = replace(_flow("latest", None, None), staged=staged, retries=retries)
    page = render(_page(flow))
    assert (
        '<p class="staged">5 changes staged in 2 micro-batches, the oldest 45 s old: not in '
        "the table until applied (within max_staleness; <code>autocdc apply</code> applies "
        "them now; <code>autocdc query --fresh</code> reads them merged in).</p>" in page
    )
    assert (
        "Started again 2 times in its last run after failures, the last: "
        "<code>Py4JJavaError</code> &lt;worker&gt;</p>" in page
    )
    nothing = replace(_flow("latest", None, None), staged={**staged, "rows": 0})
    assert 'class="staged"' not in render(_page(nothing))
