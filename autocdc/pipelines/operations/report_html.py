"""The status page as one self-contained HTML file: inline CSS and SVG, no script.

Everything here works on plain values gathered by :mod:`autocdc.pipelines.operations.report`, so
the page can be rendered (and tested) without Spark. Every value that comes from data
or names (flows, reasons, raw rows, key values) goes through :func:`html.escape`; the
plots carry only numbers, times and fixed labels. A Content-Security-Policy forbids
scripts and any network access, so the page works (and stays inert) offline.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from html import escape
from typing import Any

from autocdc.pipelines.errors import PipelineError

# Longest raw row shown in full; a wide row is cut (the table keeps the whole text).
ROW_CHARS = 400


class ReportDependencyError(PipelineError):
    error_class = "AUTOCDC_REPORT_DEPENDENCY_MISSING"
    template = (
        "The status page draws its plots with matplotlib, which is not installed. "
        "Install it with: pip install 'autocdc[report]'"
    )


@dataclass(frozen=True)
class Batch:
    """One batch event of the event log (NULL columns stay None)."""

    event_time: datetime
    batch_id: int | None
    rows_in: int | None
    upserted: int | None
    deleted: int | None
    quarantined: int | None
    lag_files: int | None
    lag_seconds: float | None


@dataclass(frozen=True)
class Quarantine:
    table: str
    reasons: list[tuple[str, int]]
    samples: list[dict[str, Any]]  # quarantined_at, batch_id, reason, sequence, row


@dataclass(frozen=True)
class Timeline:
    """The versions of one key: (start, end or None if current, values) as text."""

    key: dict[str, str]
    columns: list[str]
    versions: list[tuple[str | None, str | None, list[str | None]]]
    missing: list[str]  # key columns the target does not have


@dataclass(frozen=True)
class FlowStatus:
    flow: str
    target: str
    target_exists: bool
    scd2: bool
    batches: list[Batch] | None  # None: no event log
    last_error: tuple[datetime, str, str] | None
    quarantine: Quarantine | None  # None: no quarantine table
    timeline: Timeline | None  # None: not SCD2 or no key asked


@dataclass(frozen=True)
class Page:
    pipeline: str
    generated_at: datetime
    event_log: str
    event_log_found: bool
    key: dict[str, str]
    flows: list[FlowStatus]


CSS = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 64em; color: #222; }
h1 { font-size: 1.6em; } h2 { border-top: 2px solid #ccd; padding-top: .8em; margin-top: 2em; }
h3 { font-size: 1.05em; margin: 1.4em 0 .4em; }
code { background: #f3f3f6; padding: 0 .25em; border-radius: 3px; }
table { border-collapse: collapse; margin: .3em 0 1em; }
th, td { border: 1px solid #ccd; padding: .2em .6em; text-align: left; vertical-align: top; }
td.n { text-align: right; font-variant-numeric: tabular-nums; }
td.raw { font-family: monospace; font-size: 12px; word-break: break-all; max-width: 40em; }
figure { margin: 0; } figure svg { max-width: 100%; height: auto; }
figcaption { color: #555; font-size: .9em; }
.note { color: #555; font-style: italic; }
.error { background: #fdecea; border-left: 4px solid #c0392b; padding: .4em .8em; }
.meta { color: #444; }
"""
LAG_CAPTION = (
    "Source files not yet processed and the age of the oldest unprocessed input, after "
    "each batch (a gap: not recorded)."
)
# No script, no fetch of anything: inline SVG and the inline style only.
CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"


def render(page: Page) -> str:
    """The whole page as HTML text."""
    require_matplotlib()
    title = f"autocdc status: {page.pipeline}"
    log_state = "" if page.event_log_found else " (not found: no run has written it yet)"
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">',
        f"<title>{escape(title)}</title><style>{CSS}</style></head><body>",
        f"<h1>Pipeline <code>{escape(page.pipeline)}</code></h1>",
        f'<p class="meta">Generated {escape(_time(page.generated_at))} (local times, '
        f"UTC{page.generated_at.strftime('%z')}). Event log: "
        f"<code>{escape(page.event_log)}</code>{escape(log_state)}.</p>",
    ]
    if not page.flows:
        parts.append('<p class="note">No CDC flow found: the event log names none and the '
                     "warehouse holds no autocdc target. Run the pipeline first.</p>")  # fmt: skip
    else:
        parts.append("<ul>")
        for i, flow in enumerate(page.flows):
            parts.append(
                f'<li><a href="#flow-{i}">{escape(flow.flow)}</a> into '
                f"<code>{escape(flow.target)}</code></li>"
            )
        parts.append("</ul>")
    for i, flow in enumerate(page.flows):
        parts.append(_flow(i, flow, page))
    parts.append("</body></html>\n")
    return "\n".join(parts)


def _flow(index: int, flow: FlowStatus, page: Page) -> str:
    kind = "SCD type 2" if flow.scd2 else "SCD type 1"
    parts = [
        f'<section class="flow" id="flow-{index}" data-flow="{escape(flow.flow)}">',
        f"<h2>Flow <code>{escape(flow.flow)}</code> into <code>{escape(flow.target)}</code></h2>",
    ]
    meta = [kind if flow.target_exists else "no target table (never run, or fully refreshed)"]
    if flow.batches:
        last = _time(flow.batches[-1].event_time)
        meta.append(f"{len(flow.batches)} batches shown, the last at {last}")
    parts.append(f'<p class="meta">{escape("; ".join(meta))}.</p>')
    if flow.last_error is not None:
        when, error_class, message = flow.last_error
        parts.append(
            f'<p class="error">Last error, {escape(_time(when))}: '
            f"<code>{escape(error_class)}</code> {escape(message)}</p>"
        )
    parts += _batch_plots(flow.batches, page.event_log)
    parts += _quarantine(flow.quarantine)
    if flow.scd2:
        parts += _timeline(flow.timeline)
    parts.append("</section>")
    return "\n".join(parts)


def _batch_plots(batches: list[Batch] | None, event_log: str) -> list[str]:
    if batches is None:
        note = f"No event log at {event_log}, so no lag or batch history for this flow."
        return ["<h3>Lag and rows per batch</h3>", f'<p class="note">{escape(note)}</p>']
    if not batches:
        note = "The event log holds no batch of this flow yet."
        return ["<h3>Lag and rows per batch</h3>", f'<p class="note">{escape(note)}</p>']
    times = [b.event_time for b in batches]
    lag = _plot(
        times,
        {"lag_files": [b.lag_files for b in batches]},
        {"lag_seconds": [b.lag_seconds for b in batches]},
        ("files not yet processed", "age of oldest input (s)"),
    )
    rows = _plot(
        times,
        {
            "rows_in": [b.rows_in for b in batches],
            "upserted": [b.upserted for b in batches],
            "deleted": [b.deleted for b in batches],
            "quarantined": [b.quarantined for b in batches],
        },
        {},
        ("rows", ""),
    )
    return [
        "<h3>Lag</h3>",
        _figure("lag", lag, LAG_CAPTION),
        "<h3>Rows per batch</h3>",
        _figure("rows", rows, "Rows read, upserted, deleted and quarantined by each batch."),
    ]


def _figure(kind: str, svg: str, caption: str) -> str:
    return (
        f'<figure class="plot" data-plot="{kind}">{svg}'
        f"<figcaption>{escape(caption)}</figcaption></figure>"
    )


def require_matplotlib() -> None:
    """Fail before any work when the plots cannot be drawn."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ReportDependencyError() from None


def _plot(
    times: Sequence[datetime],
    left: dict[str, Sequence[float | None]],
    right: dict[str, Sequence[float | None]],
    labels: tuple[str, str],
) -> str:
    """A line plot over time as inline SVG; None values leave gaps."""
    import matplotlib
    from matplotlib.dates import AutoDateLocator, ConciseDateFormatter
    from matplotlib.figure import Figure  # no pyplot: no global state, no GUI backend

    nan = float("nan")
    with matplotlib.rc_context({"svg.fonttype": "none", "font.size": 9}):
        figure = Figure(figsize=(8, 2.8), layout="constrained")
        axes = figure.add_subplot()
        lines = []
        for name, values in left.items():
            ys = [nan if v is None else v for v in values]
            lines += axes.plot(times, ys, marker="o", markersize=3, label=name)
        axes.set_ylabel(labels[0])
        if right:
            twin = axes.twinx()
            for name, values in right.items():
                ys = [nan if v is None else v for v in values]
                lines += twin.plot(times, ys, marker="s", markersize=3, color="C3", label=name)
            twin.set_ylabel(labels[1])
        axes.legend(lines, [line.get_label() for line in lines], loc="best", fontsize=8)
        if all(v is None for values in (*left.values(), *right.values()) for v in values):
            axes.text(0.5, 0.5, "not recorded", transform=axes.transAxes, ha="center")
        span = max(times) - min(times)
        pad = span * 0.03 if span else timedelta(minutes=2)
        axes.set_xlim(min(times) - pad, max(times) + pad)  # one batch, or no values at all
        locator = AutoDateLocator()
        axes.xaxis.set_major_locator(locator)
        axes.xaxis.set_major_formatter(ConciseDateFormatter(locator))
        axes.grid(alpha=0.3)
        buffer = io.StringIO()
        figure.savefig(buffer, format="svg")
    text = buffer.getvalue()
    return text[text.index("<svg") :]  # drop the XML prolog and doctype


def _quarantine(quarantine: Quarantine | None) -> list[str]:
    parts = ["<h3>Quarantine</h3>"]
    if quarantine is None:
        return [*parts, '<p class="note">No quarantine table: no row was ever set aside.</p>']
    if not quarantine.reasons:
        return [*parts, '<p class="note">No row of this flow is quarantined.</p>']
    parts.append('<table class="reasons"><tr><th>reason</th><th>rows</th></tr>')
    for reason, count in quarantine.reasons:
        cells = f'<td><code>{escape(_text(reason))}</code></td><td class="n">{count:,}</td>'
        parts.append(f"<tr>{cells}</tr>")
    parts.append("</table>")
    parts.append(
        f"<p>Newest rows set aside (all of them in <code>{escape(quarantine.table)}</code>):</p>"
    )
    parts.append(
        '<table class="samples"><tr><th>quarantined at</th><th>batch</th><th>reason</th>'
        "<th>sequence</th><th>row</th></tr>"
    )
    for sample in quarantine.samples:
        raw = str(sample["row"])
        raw = raw if len(raw) <= ROW_CHARS else raw[:ROW_CHARS] + " ..."
        cells = [
            _time(sample["quarantined_at"]),
            _text(sample["batch_id"]),
            _text(sample["reason"]),
            _text(sample["sequence"]),
        ]
        parts.append(
            "<tr>" + "".join(f"<td>{escape(c)}</td>" for c in cells)
            + f'<td class="raw">{escape(raw)}</td></tr>'
        )  # fmt: skip
    parts.append("</table>")
    return parts


def _timeline(timeline: Timeline | None) -> list[str]:
    if timeline is None:
        note = "Pass --key COLUMN=VALUE (one per key column) to see a key's versions."
        return ["<h3>Versions of a key</h3>", f'<p class="note">{escape(note)}</p>']
    key = ", ".join(f"{k} = {v}" for k, v in timeline.key.items())
    parts = [f'<h3 class="timeline">Versions of key <code>{escape(key)}</code></h3>']
    if timeline.missing:
        note = f"The target has no column {', '.join(timeline.missing)}: the key does not apply."
        return [*parts, f'<p class="note">{escape(note)}</p>']
    if not timeline.versions:
        return [*parts, '<p class="note">The target holds no version of this key.</p>']
    parts.append(_timeline_svg(timeline.versions))
    head = "".join(f"<th>{escape(c)}</th>" for c in ["__START_AT", "__END_AT", *timeline.columns])
    parts.append(f'<table class="versions"><tr><th>#</th>{head}</tr>')
    for i, (start, end, values) in enumerate(timeline.versions, 1):
        cells = [_text(start), "current" if end is None else end, *map(_text, values)]
        parts.append(
            f'<tr><td class="n">{i}</td>' + "".join(f"<td>{escape(c)}</td>" for c in cells)
            + "</tr>"
        )  # fmt: skip
    parts.append("</table>")
    return parts


def _timeline_svg(versions: list[tuple[str | None, str | None, list[str | None]]]) -> str:
    """One bar per version, in sequence order (ordinal, since a sequence may be any type):
    open-ended and green while current, red-ended where the key was deleted."""
    width, left, row = 760, 40, 30
    span = (width - left - 10) / len(versions)
    height = row * len(versions) + 10
    out = [
        f'<figure class="plot" data-plot="timeline"><svg xmlns="http://www.w3.org/2000/svg" '
        f'width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img">'
        "<title>Versions of the key, oldest first</title>"
    ]
    for i, (start, end, _) in enumerate(versions):
        following = versions[i + 1][0] if i + 1 < len(versions) else None
        current, deleted = end is None, end is not None and end != following
        x, y = left + i * span, 5 + i * row
        fill = "#2e8b57" if current else "#4a78b5"
        label = f"{_text(start)} → {'current' if current else _text(end)}"
        out.append(
            f'<text x="4" y="{y + 19}" font-size="12">v{i + 1}</text>'
            f'<rect class="version" x="{x:.1f}" y="{y}" width="{span:.1f}" height="{row - 6}" '
            f'fill="{fill}" rx="3"/>'
            f'<text x="{x + 4:.1f}" y="{y + 17}" font-size="11" fill="#fff">{escape(label)}</text>'
        )
        if deleted:
            out.append(
                f'<rect x="{x + span - 5:.1f}" y="{y}" width="5" height="{row - 6}" fill="#c0392b">'
                "<title>deleted here</title></rect>"
            )
    out.append(
        "</svg><figcaption>Each bar is a version, from its __START_AT to its __END_AT "
        "(green: current; red end: the key was deleted).</figcaption></figure>"
    )
    return "".join(out)


def _time(value: datetime | None) -> str:
    return "" if value is None else value.strftime("%Y-%m-%d %H:%M:%S")


def _text(value: object) -> str:
    return "NULL" if value is None else str(value)
