"""The status page: gathered from real tables, rendered, and opened in headless Chromium.

The event log is written by hand to its contract (its writer lives elsewhere); the SCD
type 2 target and its quarantine come from the engine itself.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import uuid
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from autocdc import AutoCdcFlow
from autocdc.pipelines.declare import project as projects
from autocdc.pipelines.execute import eventlog
from autocdc.pipelines.operations.report import add_arguments, key_pair, write_report
from autocdc.pipelines.operations.report_html import (
    FlowStatus,
    Page,
    Quarantine,
    ReportDependencyError,
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
CHANGES = "id INT, name STRING, city STRING, op STRING, seq BIGINT"


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
    id=5 and two NULL-key rows in quarantine, and a flow whose target does not exist.
    Module-scoped (two engine batches cost seconds), so the names are its own."""
    suffix = uuid.uuid4().hex[:8]
    customers, orders = f"customers_{suffix}", f"orders_{suffix}"
    flow = AutoCdcFlow(
        target=customers,
        name="customers_cdc",
        keys=["id"],
        sequence_by="seq",
        apply_as_deletes="op = 'D'",
        except_column_list=["op", "seq"],
        stored_as_scd_type=2,
    )
    flow.apply(
        spark.createDataFrame(
            [
                (5, "Ann", "Oslo", "U", 1),
                (5, "Ann", "Rome", "U", 3),
                (7, "Bob", "Lima", "U", 2),
                (None, "Nil", "Oslo", "U", 4),
                (None, "<script>alert(1)</script>", "Oslo", "U", 5),
                (5, "Ann", "Rome", "D", 6),
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
        for plot in ("lag", "rows", "timeline"):
            assert cdc.locator(f'figure[data-plot="{plot}"] svg').count() == 1
        assert "lag_seconds" in cdc.locator('figure[data-plot="lag"] svg').text_content()
        assert cdc.locator(".error").inner_text().endswith("X <boom>")
        reasons = cdc.locator("table.reasons tr td").all_inner_texts()
        assert reasons == ["AUTOCDC_NULL_KEY", "2"]
        assert cdc.locator("table.samples tr").count() == 3  # header and the two rows
        assert "<script>alert(1)</script>" in cdc.locator("table.samples").inner_text()
        versions = [
            row.locator("td").all_inner_texts()[1:]
            for row in cdc.locator("table.versions tr").all()[1:]
        ]
        assert versions == [["1", "3", "Ann", "Oslo"], ["3", "6", "Ann", "Rome"]]
        assert cdc.locator("svg rect.version").count() == 2
        orders = page.locator('section[data-flow="orders_cdc"]')
        assert orders.locator("svg").count() == 2  # its plots; no target, so no timeline
        assert "no target table" in orders.locator(".meta").inner_text()
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
