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


def _row(name: str, s: dict[str, Any]) -> str:
    c = s.get("correctness", {})
    verdict = "yes" if c.get("correct") else f"no ({c.get('mismatched_touched', '?')} rows)"
    return (
        f"| {name} | {s['median_s']} | {s['rows_per_s']:,} | {s['files_per_batch']} "
        f"| {s['bytes_per_batch'] / 2**20:.1f} | {s['heap_peak_mb']:.0f} | {s['load_s']} "
        f"| {verdict} |"
    )


def _targets(summary: dict[str, Any]) -> list[str]:
    ratios, met = summary["ratios"], summary["targets_met"]
    heap = met["heap_by_batch_rows_mb"]
    heap_text = ", ".join(f"{int(b):,} rows: {mb:.0f} MiB" for b, mb in heap.items())
    flat = max(heap.values()) <= 1.2 * min(heap.values())
    return [
        f"| SCD1 <= 1.3x the floor | {ratios['scd1_vs_floor']}x | {met['scd1_le_1.3x_floor']} |",
        f"| SCD2 <= 1.6x the floor | {ratios['scd2_vs_floor']}x | {met['scd2_le_1.6x_floor']} |",
        f"| 10x target <= 2x per batch (SCD1) | {ratios['scale_10x']}x "
        f"| {met['10x_target_le_2x_time']} |",
        f"| driver heap flat in batch size | {heap_text} | {flat} |",
    ]


def write(detail: dict[str, Any], md: Path, png: Path) -> None:
    summary, head, w = detail["summary"], detail["headline"], detail["workload"]
    _plot(summary["scaling"], png)
    m = detail["machine"]
    lines = [
        "# Benchmarks",
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
        "| system | s/batch | rows/s | files/batch | MiB/batch | heap peak MiB | load s "
        "| matches reference |",
        "|---|---|---|---|---|---|---|---|",
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
