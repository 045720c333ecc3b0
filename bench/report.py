"""Turn a results dict into medians, per-repeat ratios, markdown tables and a chart.

Ratios are computed inside each repeat (Triton and the thing it is compared with were
measured minutes apart at most) and the median over repeats is quoted, which keeps
the shared machine's slow drifts out of the ratios.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from bench import docs_text

TEXT_LOADS_FOR_TARGETS = ("16 x 1", "4 x 32")
LATENCY_LOAD = "1 x 1"
LATENCY_BUDGET_MS = 1.0
CEILING_SHARE = 0.9
PEER_FLOORS = (("infinity", 2.5), ("infinity-onnx", 2.5), ("fastapi", 3.0))
STAT_KEYS = ("items_per_s", "qps", "mean_ms", "median_ms", "p95_ms", "p99_ms", "std_ms")
SERVER_KEYS = (
    "avg_batch_size",
    "avg_request_ms",
    "avg_queue_ms",
    "avg_compute_input_ms",
    "avg_compute_infer_ms",
    "avg_compute_output_ms",
)


def median(values: list[float]) -> float:
    """Median, or NaN for no values."""
    return statistics.median(values) if values else float("nan")


class Summary:
    """Medians and ratios over the repeats of one results dict."""

    def __init__(self, results: dict[str, Any]):
        """Index the runs by (load, system) and the ceilings by (repeat, load)."""
        self.results = results
        self.meta = results["meta"]
        self.headline = f"triton-{self.meta['args']['protocol']}"
        self.runs: dict[tuple[str, str], list[dict]] = defaultdict(list)
        self.by_repeat: dict[tuple[str, str, int], dict] = {}
        for run in results["runs"]:
            self.runs[(run["load"], run["system"])].append(run)
            self.by_repeat[(run["load"], run["system"], run["repeat"])] = run
        self.ceilings = {(c["repeat"], c["load"]): c for c in results["ceiling"]}
        self.load_ceilings = {(c["repeat"], c["load"]): c for c in results.get("load_ceiling", [])}
        self.loads = list(dict.fromkeys(run["load"] for run in results["runs"]))
        self.kinds = {run["load"]: run["kind"] for run in results["runs"]}
        self.systems = list(dict.fromkeys(run["system"] for run in results["runs"]))

    def stat(self, load: str, system: str, key: str) -> float:
        """Median over repeats of one client-side statistic."""
        return median([r["result"][key] for r in self.runs.get((load, system), [])])

    def errors(self, load: str, system: str) -> int:
        """Errors summed over repeats."""
        return sum(r["result"]["errors"] for r in self.runs.get((load, system), []))

    def foreign(self, load: str, system: str) -> float:
        """Median share of the machine used by other processes during the runs."""
        return median([r["foreign_cpu"] for r in self.runs.get((load, system), [])])

    def ceiling(self, key: str, load: str | None = None) -> float:
        """Median over repeats of a ceiling figure (for one load's measurements if given)."""
        rows = [c for c in self.results["ceiling"] if load is None or c["load"] == load]
        return median([c[key] for c in rows if key in c and c[key] == c[key]])

    def ratio_to_ceiling(self, load: str, system: str, key: str = "batch32_items_per_s") -> float:
        """Median over repeats of served sentences/s / an ORT figure of the same repeat.

        ``key`` is ``batch32_items_per_s`` (length-sorted batches of 32, the default) or
        ``batch1_items_per_s``.
        """
        values = []
        for (rep, ceiling_load), ceiling in self.ceilings.items():
            run = self.by_repeat.get((load, system, rep))
            if ceiling_load == load and run and ceiling[key]:
                values.append(run["result"]["items_per_s"] / ceiling[key])
        return median(values)

    def ratio(self, load: str, system: str, other: str) -> float:
        """Median over repeats of ``system`` sentences/s / ``other`` sentences/s."""
        values = []
        for run in self.runs.get((load, system), []):
            peer = self.by_repeat.get((load, other, run["repeat"]))
            if peer and peer["result"]["items_per_s"]:
                values.append(run["result"]["items_per_s"] / peer["result"]["items_per_s"])
        return median(values)

    def load_ceiling(self, load: str, key: str = "best_items_per_s") -> float:
        """Median over repeats of a figure of ``load``'s own ceiling (rows it timed)."""
        return median(
            [c[key] for (_, name), c in self.load_ceilings.items() if name == load and key in c]
        )

    def ratio_to_load_ceiling(self, load: str, system: str) -> float:
        """Median over repeats of served sentences/s / the load's own ceiling, same repeat."""
        values = []
        for (rep, name), ceiling in self.load_ceilings.items():
            run = self.by_repeat.get((load, system, rep))
            if name == load and run and ceiling["best_items_per_s"]:
                values.append(run["result"]["items_per_s"] / ceiling["best_items_per_s"])
        return median(values)

    def image_ratio(self, load: str, system: str) -> float:
        """Median over repeats of served images/s / the image tower's best in-process rate."""
        best = {
            c["repeat"]: max(
                c["batch32_items_per_s"],
                c["batch1_items_per_s"],
                c.get("parallel_items_per_s", 0.0),
            )
            for c in self.results["image_ceiling"]
        }
        values = [
            run["result"]["items_per_s"] / best[run["repeat"]]
            for run in self.runs.get((load, system), [])
            if best.get(run["repeat"])
        ]
        return median(values)

    def latency_gap(self, system: str) -> float:
        """Median over repeats of 1 x 1 p50 minus the ORT batch-1 p50 (ms)."""
        values = []
        for run in self.runs.get((LATENCY_LOAD, system), []):
            ceiling = self.ceilings.get((run["repeat"], LATENCY_LOAD))
            if ceiling:
                values.append(run["result"]["median_ms"] - ceiling["batch1_p50_ms"])
        return median(values)

    def server(self, load: str, system: str) -> list[dict[str, Any]]:
        """Per-model server-side medians (Triton systems only), in ensemble order."""
        per_model: dict[str, dict[str, list[float]]] = {}
        for run in self.runs.get((load, system), []):
            for stat in run["result"].get("server") or []:
                entry = per_model.setdefault(stat["name"], defaultdict(list))
                count = stat["execution_count"]
                entry["avg_batch_size"].append(stat["inference_count"] / count if count else 0)
                for key in SERVER_KEYS[1:]:
                    entry[key].append(stat[key])
        return [
            {"name": name, **{k: median(v) for k, v in values.items()}}
            for name, values in per_model.items()
        ]

    def targets(self) -> list[tuple[str, str, str, bool]]:
        """(target, load, measured, met) for every target the run has data for."""
        out = []
        h = self.headline

        def add(name: str, load: str, value: float, text: str, met: bool) -> None:
            if value == value:  # not NaN: the run measured it
                out.append((name, load, text, met))

        for load in TEXT_LOADS_FOR_TARGETS:
            value = self.ratio_to_load_ceiling(load, h)
            add(
                f"served >= {CEILING_SHARE} x the load's ceiling",
                load,
                value,
                f"{value:.2f} x",
                value >= CEILING_SHARE,
            )
        gap = self.latency_gap(h)
        add(
            f"p50 <= ORT batch-1 p50 + {LATENCY_BUDGET_MS:g} ms",
            LATENCY_LOAD,
            gap,
            f"{gap:+.2f} ms",
            gap <= LATENCY_BUDGET_MS,
        )
        for load in self.loads:
            if self.kinds[load] != "text":
                continue
            for peer, floor in PEER_FLOORS:
                value = self.ratio(load, h, peer)
                add(f"served >= {floor} x {peer}", load, value, f"{value:.2f} x", value >= floor)
        for load in self.loads:
            if self.kinds[load] != "text":
                value = self.image_ratio(load, h)
                add(
                    f"served >= {CEILING_SHARE} x image tower's best in-process",
                    load,
                    value,
                    f"{value:.2f} x",
                    value >= CEILING_SHARE,
                )
        return out


def write_report(results: dict[str, Any], docs: Path, device: str, write_docs: bool = True) -> str:
    """Write the markdown and chart (if ``write_docs``); return a plain-text summary."""
    summary = Summary(results)
    suffix = "" if device == "cpu" else f"-{device}"
    chart = docs / f"bench-throughput{suffix}.png"
    doc = docs / f"benchmarks{suffix}.md"
    if write_docs:
        docs.mkdir(parents=True, exist_ok=True)
        draw_chart(summary, chart)
        previous = doc.read_text() if doc.exists() else ""
        doc.write_text(docs_text.render(summary, chart.name, previous))
    return docs_text.plain_summary(summary)


def draw_chart(summary: Summary, path: Path) -> None:
    """Throughput vs concurrency (1 sentence per request) and the 4 x 32 load, per system."""
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    single = [
        load for load in summary.loads if load.endswith(" x 1") and summary.kinds[load] == "text"
    ]
    single.sort(key=lambda load: int(load.split(" x ")[0]))
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5), width_ratios=[2, 1])
    systems = [s for s in summary.systems if any((load, s) in summary.runs for load in single)]
    colour = {system: f"C{i}" for i, system in enumerate(summary.systems)}
    for system in systems:
        xs = [int(load.split(" x ")[0]) for load in single if (load, system) in summary.runs]
        ys = [
            summary.stat(load, system, "items_per_s")
            for load in single
            if (load, system) in summary.runs
        ]
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
