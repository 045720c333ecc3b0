"""The throughput chart of a ``bench.run`` results dict, then ``docs/benchmarks.md`` again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench import docs_text, page
from bench.summary import Summary


def write_report(results: dict[str, Any], docs: Path, device: str, write_docs: bool = True) -> str:
    """Draw the chart and write :mod:`bench.page` (``write_docs``, CPU); a plain-text summary."""
    summary = Summary(results)
    if write_docs and device == "cpu":
        docs.mkdir(parents=True, exist_ok=True)
        draw_chart(summary, docs / "bench-throughput.png")
        page.main(["--out", str(docs / "benchmarks.md")])
    return docs_text.plain_summary(summary)


def draw_chart(summary: Summary, path: Path) -> None:
    """Throughput vs concurrency (1 sentence per request) and the 4 x 32 load, per system."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    single = [
        load for load in summary.loads if load.endswith(" x 1") and summary.kinds[load] == "text"
    ]
    single.sort(key=lambda load: int(load.split(" x ")[0]))
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5), width_ratios=[2, 1])
    systems = [s for s in summary.systems if any((load, s) in summary.runs for load in single)]
    colour = {system: f"C{i}" for i, system in enumerate(summary.systems)}
    for system in systems:
        measured = [load for load in single if (load, system) in summary.runs]
        xs = [int(load.split(" x ")[0]) for load in measured]
        ys = [summary.stat(load, system, "items_per_s") for load in measured]
        left.plot(xs, ys, marker="o", label=system, color=colour[system])
    b32, b1 = summary.ceiling("batch32_items_per_s"), summary.ceiling("batch1_items_per_s")
    for ax in (left, right):
        ax.axhline(b32, color="black", linestyle="--", linewidth=1, label="ORT sorted batch 32")
        ax.axhline(b1, color="grey", linestyle=":", linewidth=1, label="ORT batch 1")
    left.set_xscale("log", base=2)
    left.set_xticks([int(load.split(" x ")[0]) for load in single])
    left.set_xticklabels([load.split(" x ")[0] for load in single])
    left.set_xlabel("concurrent clients (1 sentence per request)")
    left.set_ylabel("sentences / s (median of repeats)")
    left.set_title("all-MiniLM-L6-v2: throughput vs concurrency")
    top = max([b32, b1, *[line.get_ydata().max() for line in left.get_lines()[: len(systems)]]])
    for ax in (left, right):
        ax.set_ylim(0, top * 1.3)
    left.legend(fontsize=7, loc="upper left", ncol=3)
    batch_load = "4 x 32"
    names = [s for s in summary.systems if (batch_load, s) in summary.runs]
    values = [summary.stat(batch_load, s, "items_per_s") for s in names]
    right.bar(names, values, color=[colour[s] for s in names])
    right.set_title("4 clients x 32 sentences")
    right.tick_params(axis="x", rotation=30, labelsize=8)
    fig.suptitle(
        f"{summary.meta['machine']['cores']}-core {summary.meta['machine']['cpu']}", fontsize=9
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
