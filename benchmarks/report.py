"""BENCHMARKS.md and the scaling plot, from one run's results."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

REPRODUCE = "python benchmarks/run.py   # after `make setup`; --quick for a 5-minute version"


def _plot(scaling: dict[str, Any], png: Path) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, axis, label in (
        (axes[0], "target_rows", "target rows (fixed batch)"),
        (axes[1], "batch_rows", "batch rows (fixed target)"),
    ):
        for system in ("scd1", "floor"):
            points = scaling[f"{system}_s_by_{axis}"]
            xs = sorted(points, key=int)
            ax.plot([int(x) for x in xs], [points[x] for x in xs], marker="o", label=system)
        ax.set_xscale("log")
        ax.set_xlabel(label)
        ax.set_ylabel("median seconds per batch")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.suptitle("autocdc SCD1 vs the floor (one Delta MERGE)")
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)


def _cells(name: str, s: dict[str, Any]) -> str:
    return (
        f"| {name} | {s['median_s']} | {s['rows_per_s']:,} | {s['jobs_per_batch']} "
        f"| {s['files_per_batch']} | {s['bytes_per_batch'] / 2**20:.2f} "
        f"| {s['heap_peak_mb']:.0f} |"
    )


def _row(name: str, s: dict[str, Any]) -> str:
    c = s["correctness"]
    verdict = "yes" if c["correct"] else f"no ({c['mismatched_touched']} rows)"
    return f"{_cells(name, s)} {s['load_s']} | {s['aux_vs_target']} | {verdict} |"


def _targets(summary: dict[str, Any]) -> list[str]:
    ratios, met = summary["ratios"], summary["targets_met"]
    history = ratios["scd2_history_10_vs_1"]
    heap = met["heap_by_batch_rows_mb"]
    heap_text = ", ".join(f"{int(b):,} rows: {mb:.0f} MiB" for b, mb in heap.items())
    flat = max(heap.values()) <= 1.2 * min(heap.values())
    return [
        f"| SCD1 <= 1.3x the floor | {ratios['scd1_vs_floor']}x | {met['scd1_le_1.3x_floor']} |",
        f"| SCD2 <= 1.6x the floor | {ratios['scd2_vs_floor']}x | {met['scd2_le_1.6x_floor']} |",
        f"| SCD2 <= 1.3x the hand-written SCD2 MERGE | {ratios['scd2_vs_hand_scd2']}x "
        f"| {met['scd2_le_1.3x_hand_scd2']} |",
        f"| Delta commits per batch (floor, SCD1, SCD2) | "
        f"{', '.join(str(summary['commits_per_batch'].get(n)) for n in ('floor', 'scd1', 'scd2'))}"
        " | |",
        f"| 10x target <= 2x per batch (SCD1) | {ratios['scale_10x']}x "
        f"| {met['10x_target_le_2x_time']} |",
        f"| driver heap flat in batch size | {heap_text} | {flat} |",
        f"| bytes written per batch, SCD1 <= 1.5x the floor | {ratios['scd1_bytes_vs_floor']}x "
        f"| {met['scd1_bytes_le_1.5x_floor']} |",
        f"| bytes written per batch, SCD2 <= 1.5x the floor | {ratios['scd2_bytes_vs_floor']}x "
        f"| {met['scd2_bytes_le_1.5x_floor']} |",
        f"| state + quarantine size <= 0.5x the target (SCD1) | {ratios['scd1_aux_vs_target']}x "
        f"| {met['scd1_aux_le_0.5x_target']} |",
        f"| state + quarantine size / the target (SCD2) | {ratios['scd2_aux_vs_target']}x "
        "| no target |",
        f"| small batch, SCD1 <= 1.5x the floor | {ratios['small_scd1_vs_floor']}x "
        f"| {met['small_scd1_le_1.5x_floor']} |",
        f"| small batch, SCD2 <= 2x the floor | {ratios['small_scd2_vs_floor']}x "
        f"| {met['small_scd2_le_2x_floor']} |",
        f"| SCD2 batch after 10 batches of history <= 1.3x after 1 "
        f"| {'not run' if history is None else f'{history}x'} "
        f"| {'-' if history is None else met['scd2_history_10_vs_1_le_1.3x']} |",
    ]


def _history(detail: dict[str, Any]) -> str:
    w = detail["history_workload"]
    if w is None:
        return "SCD2 history: not run in this mode (it does not fit in the quick run's budget)."
    scd2 = detail["history"]["scd2"]
    return (
        f"SCD2 history: {w['target_rows']:,} target rows, then {w['batches']} batches of "
        f"{w['batch_rows']:,} updates and deletes (no inserts) of the same {w['hot_keys']:,} "
        "keys, so batch k finds k - 1 earlier batches of history on its keys. The ratio is "
        "the median seconds of batches 11-12 (10 and 11 batches of history) over batches 2-3 "
        "(1 and 2); batch 1 is a warm-up. Seconds per batch: "
        f"{', '.join(str(x) for x in scd2['per_batch_s'])}; jobs per batch (median) "
        f"{scd2['jobs_per_batch']}; state + quarantine size after the last: "
        f"{scd2['aux_vs_target']}x the target."
    )


def _partial(p: dict[str, Any] | None) -> list[str]:
    """The partial-upsert measure (absent from results of runs before it existed)."""
    if p is None:
        return []
    return [
        "## Partial upserts",
        "",
        f"One partial target (SCD1) loaded with the headline's snapshot; a batch of "
        f"{p['rows']:,} full-row updates, then the same keys as partial upserts that set "
        f"{', '.join(p['columns_set'])} (newer sequences, from a second flow reading only "
        "those columns). One measured batch each, after a full-row warm-up.",
        "",
        "| batch | s | jobs | MiB written |",
        "|---|---|---|---|",
        f"| full rows | {p['full_s']} | {p['full_jobs']} | {p['full_bytes'] / 2**20:.2f} |",
        f"| partial upserts | {p['partial_s']} | {p['partial_jobs']} "
        f"| {p['partial_bytes'] / 2**20:.2f} |",
        f"| partial / full | {p['seconds_ratio']}x | | {p['bytes_ratio']}x |",
        "",
    ]


def _steps(summary: dict[str, Any]) -> list[str]:
    """Where an autocdc batch's time goes, headline and small batches (absent from results
    of runs before the engine timed its steps)."""
    rows = [
        (f"{name}{label}", steps)
        for key, label in (("steps_s", ""), ("small_steps_s", ", small batch"))
        for name, steps in summary.get(key, {}).items()
    ]
    if not rows:
        return []
    names = list(dict.fromkeys(step for _, steps in rows for step in steps))
    return [
        "## Where a batch's time goes",
        "",
        "Median seconds of each step of an autocdc batch (`BatchMetrics.steps`): prepare "
        "(definition, tables, catch-up), stage (validate, deduplicate), plan (state lookup "
        "and reconcile), quarantine, redo (the outcome written first), merge (the target), "
        "state (state and quarantine appended), maintain (compaction). Lazy work counts in "
        "the step that forces it.",
        "",
        f"| batch | {' | '.join(names)} |",
        f"|---|{'---|' * len(names)}",
        *(f"| {row} | {' | '.join(str(s.get(n, '-')) for n in names)} |" for row, s in rows),
        "",
    ]


def _small_and_history(detail: dict[str, Any]) -> list[str]:
    w = detail["workload"]
    return [
        "## Small batches and SCD2 history",
        "",
        f"Small batches: after the headline batches, {w['tail_batches']} x "
        f"{w['tail_rows']} changes (same mix) into the same tables, all measured (the "
        "tables are warm), medians. Fixed overhead shows here; they are also the smallest "
        "batch_rows point of the scaling plot.",
        "",
        "| system | s/batch | rows/s | jobs/batch | files/batch | MiB/batch | heap peak MiB |",
        "|---|---|---|---|---|---|---|",
        *(_cells(name, s["small"]) for name, s in detail["headline"].items()),
        "",
        _history(detail),
        "",
    ]


def write(detail: dict[str, Any], md: Path, png: Path) -> None:
    summary, head, w = detail["summary"], detail["headline"], detail["workload"]
    _plot(summary["scaling"], png)
    m = detail["machine"]
    lines = [
        "# Benchmarks",
        "",
        f"Generated by `python benchmarks/run.py` on {m.get('date', 'an unrecorded date')}, "
        f"engine at {m.get('commit', 'an unrecorded commit')}; earlier runs: "
        "[history.md](history.md), paired A/B runs: [ab-record.md](ab-record.md).",
        "",
        f"Machine: {m['cpus']} cores, {m['memory_gib']} GiB, {m['platform']}; Python "
        f"{m['python']}, Java {m['java']}, Spark {m['spark']} ({m['spark_master']}, "
        f"{m['shuffle_partitions']} shuffle partitions, driver memory {m['driver_memory']}).",
        "",
        f"Workload: {w['target_rows']:,} target rows, batches of {w['batch_rows']:,} changes "
        f"({w['insert_share']:.0%} inserts, {w['delete_share']:.0%} deletes of the on-time "
        f"changes, {w['late_share']:.0%} late, {w['duplicate_share']:.0%} duplicates), "
        f"{w['width']} payload columns, key skew {w['skew']}, seed {w['seed']}. "
        f"{w['batches']} batches; the first is a warm-up, times are medians of the rest.",
        "",
        "Jobs: Spark jobs started during a batch. Bytes: files added under all the "
        "system's table folders (autocdc: target, state, quarantine). Aux / target: size "
        "of the state and quarantine tables' current Delta snapshots over the target's "
        "(`DESCRIBE DETAIL` sizeInBytes) after the last batch.",
        "",
        "| system | s/batch | rows/s | jobs/batch | files/batch | MiB/batch | heap peak MiB "
        "| load s | aux / target | matches reference |",
        "|---|---|---|---|---|---|---|---|---|---|",
        *(_row(name, s) for name, s in head.items()),
        "",
        "| target | measured | met |",
        "|---|---|---|",
        *_targets(summary),
        "",
        "Spark 4.2 `create_auto_cdc_flow` (spark-pipelines): "
        f"{summary['spark_pipelines']['status']}.",
    ]
    error = summary["spark_pipelines"].get("error")
    if error:
        lines += ["", "```", str(error), "```"]
    lines += [
        "",
        *_steps(summary),
        *_small_and_history(detail),
        *_partial(summary.get("partial_vs_full")),
        "## Scaling (SCD1 and the floor)",
        "",
        f"![scaling]({png.name})",
        "",
        "| axis | value | scd1 s/batch | floor s/batch |",
        "|---|---|---|---|",
    ]
    sc = summary["scaling"]
    for axis in ("target_rows", "batch_rows"):
        for value in sorted(sc[f"scd1_s_by_{axis}"], key=int):
            lines.append(
                f"| {axis} | {int(value):,} | {sc[f'scd1_s_by_{axis}'][value]} "
                f"| {sc[f'floor_s_by_{axis}'].get(value, 'not run')} |"
            )
    lines += ["", "## Reproduce", "", "```", REPRODUCE, "```", ""]
    md.write_text("\n".join(lines))
