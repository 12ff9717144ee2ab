"""The status page as one self-contained HTML file: inline CSS and SVG, no script.

Everything here works on plain values gathered by :mod:`autocdc.pipelines.operations.report`, so
the page can be rendered (and tested) without Spark. Every value that comes from data
or names (flows, reasons, raw rows, key values) goes through :func:`html.escape`; the
plots carry only numbers, times and fixed labels. A Content-Security-Policy forbids
scripts and any network access, so the page works (and stays inert) offline.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from html import escape
from itertools import pairwise
from typing import TYPE_CHECKING, Any

from autocdc.pipelines.errors import PipelineError

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.lines import Line2D

# Longest quarantined record shown in full; a longer one is cut (the table keeps it whole).
ROW_CHARS = 2000
# Up to this many bars, each is labelled with its value; beyond, the labels would collide.
LABELLED_BARS = 24
# upserted, deleted, quarantined, merged within the batch or stale
ROW_COLORS = ["#4a78b5", "#e0a030", "#c0392b", "#c8c8c8"]
# Local times on the x axis, e.g. 09:05 under an offset of 2026-11-30, or 30 Nov at midnight.
TIME_FORMATS = {
    "formats": ["%Y", "%b %Y", "%d %b", "%H:%M", "%H:%M", "%H:%M:%S"],
    "zero_formats": ["", "%Y", "%b %Y", "%d %b", "%H:%M", "%H:%M:%S"],
    "offset_formats": ["", "%Y", "%b %Y", "%Y-%m-%d", "%Y-%m-%d", "%Y-%m-%d %H:%M"],
}


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
    seconds: float | None  # how long the batch took
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
    # As `autocdc status` has them: what a max_staleness flow holds staged, and how often
    # the flow was started again after failures in its last run (None: neither).
    staged: dict[str, Any] | None = None
    retries: dict[str, Any] | None = None


@dataclass(frozen=True)
class Page:
    pipeline: str
    generated_at: datetime
    event_log: str
    event_log_found: bool
    key: dict[str, str]
    flows: list[FlowStatus]
    # The last run as `autocdc status` reports it (status, started, ended, error), if any.
    last_run: dict[str, Any] | None = None


CSS = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 64em; color: #222; }
h1 { font-size: 1.6em; } h2 { border-top: 2px solid #ccd; padding-top: .8em; margin-top: 2em; }
h3 { font-size: 1.05em; margin: 1.4em 0 .4em; }
code { background: #f3f3f6; padding: 0 .25em; border-radius: 3px; }
table { border-collapse: collapse; margin: .3em 0 1em; }
th, td { border: 1px solid #ccd; padding: .2em .6em; text-align: left; vertical-align: top; }
td.n { text-align: right; font-variant-numeric: tabular-nums; }
pre.raw { font-size: 12px; margin: 0; white-space: pre-wrap; word-break: break-all;
  max-width: 40em; max-height: 24em; overflow: auto; }
td.share { width: 12em; } td.share span { display: block; height: .9em; background: #c0392b; }
figure { margin: 0; } figure svg { max-width: 100%; height: auto; }
figcaption { color: #555; font-size: .9em; }
.note { color: #555; font-style: italic; }
.error { background: #fdecea; border-left: 4px solid #c0392b; padding: .4em .8em; }
.meta { color: #444; }
"""
LAG_CAPTION = (
    "Source files not yet processed and the age of the oldest unprocessed input after each "
    "batch, the latest value written at the end of each line"
)
ROWS_CAPTION = (
    "Rows each batch upserted, deleted and quarantined (the number above a bar: rows "
    "applied, upserted plus deleted); in grey, the rows read that changed nothing by "
    "themselves: merged within the batch (a later change of their key won, a duplicate, "
    "a delete of a key the target does not hold) or stale; the black tick: rows read."
)
# No script, no fetch of anything: inline SVG and the inline style only.
CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"


def _last_run(run: dict[str, Any]) -> str:
    """``Last run 3f2a...: stopped (interrupted by the user), started ... UTC, ended ...``:
    a run stopped with Ctrl-C is not shown as failed."""
    why = run.get("error_class") or run.get("message")
    said = f"{run['status']} ({why})" if why else run["status"]
    ended = f", ended {run['ended']}" if run.get("ended") else ""
    return (
        f'<p class="meta">Last run <code>{escape(run["run_id"])}</code>: '
        f"{escape(said)}, started {escape(run.get('started') or '-')}{escape(ended)}.</p>"
    )


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
    if page.last_run is not None:
        parts.append(_last_run(page.last_run))
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
        shown, last = _count(len(flow.batches), "batch"), _time(flow.batches[-1].event_time)
        meta.append(f"{shown} shown, the last at {last}" if len(flow.batches) > 1 else
                    f"{shown} shown, at {last}")  # fmt: skip
    parts.append(f'<p class="meta">{escape("; ".join(meta))}.</p>')
    if flow.last_error is not None:
        when, error_class, message = flow.last_error
        parts.append(
            f'<p class="error">Last error, {escape(_time(when))}: '
            f"<code>{escape(error_class)}</code> {escape(message)}</p>"
        )
    parts += _held(flow)
    parts += _batch_plots(index, flow.batches, page.event_log)
    parts += _quarantine(flow.quarantine)
    if flow.scd2:
        parts += _timeline(flow.timeline)
    parts.append("</section>")
    return "\n".join(parts)


def _held(flow: FlowStatus) -> list[str]:
    """What the flow holds staged (max_staleness: not in the table yet) and its retries."""
    said = []
    if flow.staged is not None and flow.staged["rows"]:
        held = flow.staged
        age = held.get("oldest_age_seconds")
        oldest = "" if age is None else f", the oldest {age:,.0f} s old"
        said.append(
            f'<p class="staged">{_count(held["rows"], "change")} staged in '
            f"{_count(held['batches'], 'micro-batch')}{escape(oldest)}: not in the table "
            "until applied (within max_staleness; <code>autocdc apply</code> applies them "
            "now; <code>autocdc query --fresh</code> reads them merged in).</p>"
        )
    if flow.retries is not None:
        again = flow.retries
        said.append(
            f'<p class="meta">Started again {_count(again["count"], "time")} in its last '
            f"run after failures, the last: <code>{escape(again['last_error_class'] or '')}"
            f"</code> {escape(_cut(again['last_message'] or ''))}</p>"
        )
    return said


def _batch_plots(index: int, batches: list[Batch] | None, event_log: str) -> list[str]:
    if batches is None:
        note = f"No event log at {event_log}, so no batch history or lag for this flow."
        return ["<h3>Batches</h3>", f'<p class="note">{escape(note)}</p>']
    if not batches:
        note = "The event log holds no batch of this flow yet."
        return ["<h3>Batches</h3>", f'<p class="note">{escape(note)}</p>']
    timed = [b for b in batches if b.seconds is not None]
    parts = [
        "<h3>Rows applied per batch</h3>",
        _figure("rows", _rows_plot(f"flow{index}-rows", batches), ROWS_CAPTION),
        "<h3>Batch duration</h3>",
    ]
    if timed:
        caption = "Wall time of each batch" + _left_out(len(batches) - len(timed), "duration")
        plot = _duration_plot(f"flow{index}-duration", timed, batches)
        parts.append(_figure("duration", plot, caption))
    else:
        parts.append('<p class="note">No batch of this flow recorded its duration.</p>')
    return [*parts, "<h3>Lag</h3>", _lag(index, batches)]


def _lag(index: int, batches: list[Batch]) -> str:
    known = [b for b in batches if b.lag_files is not None or b.lag_seconds is not None]
    if not known:
        note = (
            "No batch shown recorded a lag: only file and Delta table sources can tell what "
            "is still unprocessed."
        )
        return f'<p class="note">{escape(note)}</p>'
    plot = _lag_plot(f"flow{index}-lag", known, batches)
    return _figure("lag", plot, LAG_CAPTION + _lag_gaps(batches))


def _lag_gaps(batches: list[Batch]) -> str:
    """What the lag plot leaves out, which may differ between its two lines."""
    files = sum(b.lag_files is None for b in batches)
    ages = sum(b.lag_seconds is None for b in batches)
    if files == ages:
        return _left_out(files, "lag")
    gaps = [f"the file count of {_count(files, 'batch')}"] if files else []
    gaps += [f"the age of {_count(ages, 'batch')}"] if ages else []
    return f"; not recorded, so left out: {' and '.join(gaps)}."


def _left_out(missing: int, what: str) -> str:
    if not missing:
        return "."
    return f"; {_count(missing, 'batch')} with no recorded {what} left out."


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


def _rows_plot(gid: str, batches: list[Batch]) -> str:
    """Stacked bars of what each batch did with its rows, the rows read as a tick above."""
    times = [b.event_time for b in batches]
    stacks = {
        "upserted": [b.upserted or 0 for b in batches],
        "deleted": [b.deleted or 0 for b in batches],
        "quarantined": [b.quarantined or 0 for b in batches],
    }
    stacks["merged or stale"] = [
        max(0, (b.rows_in or 0) - sum(values[i] for values in stacks.values()))
        for i, b in enumerate(batches)
    ]
    applied = [f"{u + d:,}" for u, d in zip(stacks["upserted"], stacks["deleted"], strict=True)]

    def plot(axes: Axes) -> None:
        from matplotlib.ticker import MaxNLocator

        tops = _bars(axes, gid, times, stacks, ROW_COLORS, times)
        read = [b.rows_in for b in batches]
        axes.plot(times, [_nan(v) for v in read], ls="none", marker="_", ms=12, mew=1.5,
                  color="#222", label="read")  # fmt: skip
        _label(axes, times, [max(t, r or 0) for t, r in zip(tops, read, strict=True)], applied)
        axes.yaxis.set_major_locator(MaxNLocator(integer=True))
        axes.set_ylabel("rows")
        handles, labels = axes.get_legend_handles_labels()
        _legend(axes, handles[1:] + handles[:1], labels[1:] + labels[:1])  # "read" last

    return _draw(plot, times)


def _duration_plot(gid: str, batches: list[Batch], shown: list[Batch]) -> str:
    """One bar per batch with a known duration, in a unit that suits the longest; on the
    time axis of all the batches ``shown``, like the other plots."""
    times, span = [b.event_time for b in batches], [b.event_time for b in shown]
    seconds = [b.seconds or 0.0 for b in batches]
    scale, unit = _unit(max(seconds))

    def plot(axes: Axes) -> None:
        scaled = {"seconds": [s / scale for s in seconds]}
        tops = _bars(axes, gid, times, scaled, ["#3d8f8f"], span)
        _label(axes, times, tops, [_duration(s) for s in seconds])
        axes.set_ylabel(f"duration ({unit})")

    return _draw(plot, span)


def _lag_plot(gid: str, batches: list[Batch], shown: list[Batch]) -> str:
    """Files left and the oldest input's age after each batch; a batch without a value is
    left out of that line (a gap would hide a lone point)."""
    files = [(b.event_time, b.lag_files) for b in batches if b.lag_files is not None]
    ages = [(b.event_time, b.lag_seconds) for b in batches if b.lag_seconds is not None]
    scale, unit = _unit(max((a for _, a in ages), default=0.0))

    def plot(axes: Axes) -> None:
        from matplotlib.ticker import MaxNLocator

        lines = _line(axes, f"{gid}-lag_files", files, 1, "C0", "files not yet processed")
        axes.set_ylabel("files not yet processed")
        axes.yaxis.set_major_locator(MaxNLocator(integer=True))
        twin = axes.twinx()
        label = f"age of oldest input ({unit})"
        lines += _line(twin, f"{gid}-lag_seconds", ages, scale, "C3", label)
        twin.set_ylabel(label)
        twin.set_ylim(bottom=0)
        _legend(axes, lines, [line.get_label() for line in lines])

    return _draw(plot, [b.event_time for b in shown])


def _legend(axes: Axes, handles: list[Any], labels: list[str]) -> None:
    """In a row above the plot, so every plot's axes span the same width."""
    axes.legend(handles, labels, loc="lower left", bbox_to_anchor=(0, 1), ncol=len(labels),
                fontsize=8, frameon=False, borderaxespad=0.2)  # fmt: skip


def _line(
    axes: Axes, gid: str, points: list[tuple[datetime, float]], scale: float, color: str,
    label: str,
) -> list[Line2D]:  # fmt: skip
    """A step line with a marker per point (a value holds until the next batch's: a
    sloped line would invent values between two samples minutes apart), its last value
    written beside it."""
    if not points:
        return []
    xs, ys = [t for t, _ in points], [v / scale for _, v in points]
    (line,) = axes.plot(xs, ys, marker="o", ms=3.5, color=color, label=label, gid=gid,
                        drawstyle="steps-post")  # fmt: skip
    last = f"{ys[-1]:,.0f}" if scale == 1 else f"{ys[-1]:,.1f}"
    axes.annotate(last, (xs[-1], ys[-1]), xytext=(4, 4), textcoords="offset points",
                  fontsize=8, color=color)  # fmt: skip
    axes.set_ylim(bottom=0, top=max(max(ys) * 1.15, 1))
    return [line]


def _bars(
    axes: Axes, gid: str, times: list[datetime], stacks: dict[str, list[float]],
    colors: list[str], span: list[datetime],
) -> list[float]:  # fmt: skip
    """Stacked bars over time, each with its own SVG id, as wide as the batches ``span``
    allow; returns the stacks' tops."""
    width = _bar_width(span)
    tops = [0.0] * len(times)
    for (name, values), color in zip(stacks.items(), colors, strict=False):
        bars = axes.bar(times, values, width, bottom=tops, color=color, label=name)
        for i, bar in enumerate(bars):
            bar.set_gid(f"{gid}-{name.replace(' ', '-')}-{i}")
        tops = [top + value for top, value in zip(tops, values, strict=True)]
    return tops


def _bar_width(times: list[datetime]) -> float:
    """Most of the shortest gap between batches, so no two bars overlap, in days
    (matplotlib's date unit)."""
    gaps = [(b - a).total_seconds() for a, b in pairwise(times) if b > a]
    return 0.7 * min(gaps, default=120.0) / 86400


def _label(axes: Axes, times: list[datetime], tops: list[float], texts: list[str]) -> None:
    """Values above the bars, while there is room for them, and room above the tops."""
    axes.set_ylim(bottom=0, top=max(max(tops) * 1.18, 1))
    if len(times) > LABELLED_BARS:
        return
    for x, y, text in zip(times, tops, texts, strict=True):
        axes.annotate(text, (x, y), xytext=(0, 2), textcoords="offset points", ha="center",
                      va="bottom", fontsize=8)  # fmt: skip


def _time_axis(axes: Axes, times: list[datetime]) -> None:
    """Local times on x, the same for every plot of a flow, with room for a bar and a
    value beside the last point; a lone batch gets its full time as the only tick."""
    from matplotlib.dates import AutoDateLocator, ConciseDateFormatter, DateFormatter, date2num
    from matplotlib.ticker import FixedLocator

    first, last = min(times), max(times)
    bar = timedelta(days=_bar_width(times))
    pad = max(bar, (last - first) * 0.08) if last > first else 5 * bar
    axes.set_xlim(first - pad, last + pad)
    if first == last:
        axes.xaxis.set_major_locator(FixedLocator([date2num(first)]))
        axes.xaxis.set_major_formatter(DateFormatter("%Y-%m-%d %H:%M:%S"))
        return
    locator = AutoDateLocator(minticks=4, maxticks=9)
    axes.xaxis.set_major_locator(locator)
    axes.xaxis.set_major_formatter(ConciseDateFormatter(locator, **TIME_FORMATS))


def _draw(plot: Callable[[Axes], None], times: list[datetime]) -> str:
    """A figure drawn by ``plot`` over ``times`` as inline SVG (text kept as text, so it
    can be found)."""
    import matplotlib
    from matplotlib.figure import Figure  # no pyplot: no global state, no GUI backend

    with matplotlib.rc_context({"svg.fonttype": "none", "font.size": 9}):
        figure = Figure(figsize=(8.4, 2.5), layout="constrained")
        axes = figure.add_subplot()
        axes.grid(alpha=0.3)
        axes.set_axisbelow(True)
        plot(axes)
        _time_axis(axes, times)
        buffer = io.StringIO()
        figure.savefig(buffer, format="svg")
    text = buffer.getvalue()
    return text[text.index("<svg") :]  # drop the XML prolog and doctype


def _unit(seconds: float) -> tuple[float, str]:
    """A divisor and its name, so the largest of some durations reads well."""
    if seconds >= 7200:
        return 3600.0, "h"
    if seconds >= 120:
        return 60.0, "min"
    return 1.0, "s"


def _duration(seconds: float) -> str:
    scale, unit = _unit(seconds)
    return f"{seconds / scale:.1f} {unit}" if seconds < 100 or scale > 1 else f"{seconds:.0f} s"


def _nan(value: float | None) -> float:
    return float("nan") if value is None else value


def _quarantine(quarantine: Quarantine | None) -> list[str]:
    parts = ["<h3>Quarantine</h3>"]
    if quarantine is None:
        return [*parts, '<p class="note">No quarantine table: no row was ever set aside.</p>']
    if not quarantine.reasons:
        return [*parts, '<p class="note">No row of this flow is quarantined.</p>']
    total = sum(count for _, count in quarantine.reasons)
    reasons = _count(len(quarantine.reasons), "reason")
    parts.append(f"<p>{escape(_count(total, 'row'))} set aside, for {escape(reasons)}:</p>")
    parts.append('<table class="reasons"><tr><th>reason</th><th>rows</th><th></th></tr>')
    for reason, count in quarantine.reasons:
        share = 100 * count / max(count for _, count in quarantine.reasons)
        parts.append(
            f'<tr><td><code>{escape(_text(reason))}</code></td><td class="n">{count:,}</td>'
            f'<td class="share"><span style="width: {share:.0f}%"></span></td></tr>'
        )
    parts.append("</table>")
    shown = _count(len(quarantine.samples), "row")
    parts.append(
        f"<p>Newest first ({escape(shown)} shown; <code>{escape(quarantine.table)}</code> holds "
        "them all). A field holding JSON text is shown as that JSON:</p>"
    )
    parts.append(
        '<table class="samples"><tr><th>quarantined at</th><th>batch</th><th>reason</th>'
        "<th>sequence</th><th>record</th></tr>"
    )
    for sample in quarantine.samples:
        cells = [
            _time(sample["quarantined_at"]),
            _text(sample["batch_id"]),
            _text(sample["reason"]),
            _text(sample["sequence"]),
        ]
        parts.append(
            "<tr>" + "".join(f"<td>{escape(c)}</td>" for c in cells)
            + f'<td><pre class="raw">{escape(record(sample["row"]))}</pre></td></tr>'
        )  # fmt: skip
    parts.append("</table>")
    return parts


def record(row: object) -> str:
    """A quarantined row (JSON text, as the engine stores it) as indented JSON. A string
    field that holds a JSON document, like the text of a malformed event, is shown as that
    document: left a string, it would be JSON inside JSON, every quote escaped again."""
    text = _text(row)
    try:
        fields = json.loads(text)
    except ValueError:
        return _cut(text)  # not written by the engine: shown as it is
    if isinstance(fields, dict):
        fields = {name: _document(value) for name, value in fields.items()}
    return _cut(json.dumps(fields, indent=2, ensure_ascii=False))


def _document(value: object) -> object:
    if isinstance(value, str) and value.lstrip().startswith(("{", "[")):
        try:
            return json.loads(value)
        except ValueError:
            pass  # malformed text: it stays a string
    return value


def _cut(text: str) -> str:
    return text if len(text) <= ROW_CHARS else text[:ROW_CHARS] + "\n..."


def _count(n: int, noun: str) -> str:
    """``1 batch``, ``2 batches``, ``0 rows``."""
    plural = noun + ("es" if noun.endswith(("s", "ch", "sh", "x")) else "s")
    return f"{n:,} {noun if n == 1 else plural}"


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


def _on_scale(texts: list[str | None]) -> list[float | None] | None:
    """Sequence values as numbers (numbers, or ISO dates and times as seconds), None for
    an open end; None when any is neither (a string sequence has no scale)."""
    values: list[float | None] = []
    for text in texts:
        if text is None:
            values.append(None)
            continue
        try:
            values.append(float(text))
        except ValueError:
            try:
                values.append(datetime.fromisoformat(text).timestamp())
            except ValueError:
                return None
    return values


def _spans(versions: list[tuple[str | None, str | None, list[str | None]]]) -> tuple[
    list[tuple[float, float]], bool
]:  # fmt: skip
    """Each version's (start, end) as fractions of the plot's width, and whether they are
    to scale: by sequence value when the sequence is a number or a time (an open end runs
    to the right edge), else one equal slot per version, in order."""
    starts = _on_scale([start for start, _, _ in versions])
    ends = _on_scale([end for _, end, _ in versions])
    if starts is not None and ends is not None and None not in starts:
        known = [v for v in [*starts, *ends] if v is not None]
        low, high = min(known), max(known)
        if high > low:
            right = high + (high - low) * 0.15  # room for the open end of a current version
            width = right - low
            return [
                ((s - low) / width, ((right if e is None else e) - low) / width)
                for s, e in zip(starts, ends, strict=True)
                if s is not None
            ], True
    slot = 1 / len(versions)
    return [(i * slot, (i + 1) * slot) for i in range(len(versions))], False


def _timeline_svg(versions: list[tuple[str | None, str | None, list[str | None]]]) -> str:
    """One bar per version, to the scale of the sequence when it has one (see
    :func:`_spans`): open-ended and green while current, red-ended where the key was
    deleted."""
    width, left, row = 760, 40, 30
    usable = width - left - 10
    spans, scaled = _spans(versions)
    height = row * len(versions) + 10
    out = [
        f'<figure class="plot" data-plot="timeline"><svg xmlns="http://www.w3.org/2000/svg" '
        f'width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img">'
        "<title>Versions of the key, oldest first</title>"
    ]
    for i, ((start, end, _), (begin, finish)) in enumerate(zip(versions, spans, strict=True)):
        following = versions[i + 1][0] if i + 1 < len(versions) else None
        current, deleted = end is None, end is not None and end != following
        x, y, span = left + begin * usable, 5 + i * row, max((finish - begin) * usable, 3.0)
        fill = "#2e8b57" if current else "#4a78b5"
        label = f"{_text(start)} → {'current' if current else _text(end)}"
        inside = span >= 7 * len(label) + 8  # else written after the bar, in black
        tx, color = (x + 4, "#fff") if inside else (x + span + 4, "#222")
        if not inside and tx + 7 * len(label) > width:  # no room after it: before it
            tx = x - 4 - 7 * len(label)
        out.append(
            f'<text x="4" y="{y + 19}" font-size="12">v{i + 1}</text>'
            f'<rect class="version" x="{x:.1f}" y="{y}" width="{span:.1f}" height="{row - 6}" '
            f'fill="{fill}" rx="3"/>'
            f'<text x="{tx:.1f}" y="{y + 17}" font-size="11" fill="{color}">{escape(label)}</text>'
        )
        if deleted:
            out.append(
                f'<rect x="{x + span - 5:.1f}" y="{y}" width="5" height="{row - 6}" fill="#c0392b">'
                "<title>deleted here</title></rect>"
            )
    scale = "to the scale of the sequence" if scaled else "in order (the sequence has no scale)"
    out.append(
        "</svg><figcaption>Each bar is a version, from its __START_AT to its __END_AT, "
        f"{scale} (green: current; red end: the key was deleted).</figcaption></figure>"
    )
    return "".join(out)


def _time(value: datetime | None) -> str:
    return "" if value is None else value.strftime("%Y-%m-%d %H:%M:%S")


def _text(value: object) -> str:
    return "NULL" if value is None else str(value)
