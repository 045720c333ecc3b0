"""The figures of a ``bench.run`` results dict: medians over repeats, per-repeat ratios.

Ratios are computed inside each repeat (Triton and the thing it is compared with were
measured minutes apart at most) and the median over repeats is quoted, which keeps
the shared machine's slow drifts out of the ratios.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from bench.common import median

TEXT_LOADS_FOR_TARGETS = ("16 x 1", "4 x 32")
LATENCY_LOAD = "1 x 1"
LATENCY_RATIO = 1.2  # one client, one sentence: served p50 / ORT's own per-sentence p50
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


def own_p50_ms(ceiling: dict[str, Any]) -> float:
    """What a program calling ONNX Runtime itself pays per sentence, p50 (ms).

    The batch-1 run p50 plus the tokenizer's time per sentence (when the ceiling
    recorded it), on the same graph, tokenizer file and sentences.
    """
    return ceiling["batch1_p50_ms"] + ceiling.get("tokenize_us_per_sentence", 0.0) / 1e3


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
        """Median over repeats of 1 x 1 p50 minus ORT's own per-sentence p50 (ms)."""
        values = []
        for run in self.runs.get((LATENCY_LOAD, system), []):
            ceiling = self.ceilings.get((run["repeat"], LATENCY_LOAD))
            if ceiling:
                values.append(run["result"]["median_ms"] - own_p50_ms(ceiling))
        return median(values)

    def latency_ratio(self, system: str) -> float:
        """Median over repeats of 1 x 1 p50 / ONNX Runtime's per-sentence p50 in-process.

        The reference is :func:`own_p50_ms`.
        """
        values = []
        for run in self.runs.get((LATENCY_LOAD, system), []):
            ceiling = self.ceilings.get((run["repeat"], LATENCY_LOAD))
            if ceiling and ceiling["batch1_p50_ms"]:
                values.append(run["result"]["median_ms"] / own_p50_ms(ceiling))
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
        gap, ratio = self.latency_gap(h), self.latency_ratio(h)
        add(
            f"p50 <= {LATENCY_RATIO:g} x ORT's own per-sentence p50",
            LATENCY_LOAD,
            ratio,
            f"{ratio:.2f} x ({gap:+.2f} ms)",
            ratio <= LATENCY_RATIO,
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
