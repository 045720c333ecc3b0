"""The figures of a ``bench.run`` results dict: medians over repeats of per-repeat ratios.

A ratio is taken inside each repeat, so the shared machine's slow drifts stay out of it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any

from bench.common import median

TEXT_LOADS_FOR_TARGETS = ("16 x 1", "4 x 32")
LATENCY_LOAD = "1 x 1"
LATENCY_RATIO = 1.2  # one client, one sentence: served p50 / ORT's own per-sentence p50
CEILING_SHARE = 0.9
PEER_FLOORS = (("infinity", 2.5), ("infinity-onnx", 2.5), ("fastapi", 3.0))


def own_p50_ms(ceiling: dict[str, Any]) -> float:
    """ORT's batch-1 p50 plus the tokenizer's time per sentence (when recorded), in ms."""
    return ceiling["batch1_p50_ms"] + ceiling.get("tokenize_us_per_sentence", 0.0) / 1e3


def _rate_over(result: dict[str, Any], reference: float) -> float | None:
    return result["items_per_s"] / reference if reference else None


class Summary:
    """Medians and ratios over the repeats of one results dict."""

    def __init__(self, results: dict[str, Any]):
        """Index the runs by (load, system) and the ceilings by (repeat, load)."""
        self.results = results
        self.meta = results["meta"]
        self.headline = f"triton-{self.meta['args']['protocol']}"
        self.runs: dict[tuple[str, str], list[dict]] = defaultdict(list)
        for run in results["runs"]:
            self.runs[(run["load"], run["system"])].append(run)
        self.ceilings = {(c["repeat"], c["load"]): c for c in results["ceiling"]}
        self.load_ceilings = {(c["repeat"], c["load"]): c for c in results.get("load_ceiling", [])}
        self.loads = list(dict.fromkeys(run["load"] for run in results["runs"]))
        self.kinds = {run["load"]: run["kind"] for run in results["runs"]}
        self.systems = list(dict.fromkeys(run["system"] for run in results["runs"]))

    def _per_repeat(
        self,
        load: str,
        system: str,
        references: dict[int, Any],
        value: Callable[[dict[str, Any], Any], float | None] = _rate_over,
    ) -> float:
        """Median over repeats of ``value(result, references[repeat])``; None is left out."""
        values = []
        for run in self.runs.get((load, system), []):
            if run["repeat"] in references:
                found = value(run["result"], references[run["repeat"]])
                if found is not None:
                    values.append(found)
        return median(values)

    def stat(self, load: str, system: str, key: str) -> float:
        """Median over repeats of one client-side statistic."""
        return median([r["result"][key] for r in self.runs.get((load, system), [])])

    def ceiling(self, key: str, load: str | None = None) -> float:
        """Median over repeats of a ceiling figure (for one load's measurements if given)."""
        rows = [c for c in self.results["ceiling"] if load is None or c["load"] == load]
        return median([c[key] for c in rows if key in c and c[key] == c[key]])

    def ratio_to_ceiling(self, load: str, system: str, key: str = "batch32_items_per_s") -> float:
        """Served sentences/s / an ORT figure (``batch32_`` or ``batch1_items_per_s``)."""
        found = {rep: c[key] for (rep, name), c in self.ceilings.items() if name == load}
        return self._per_repeat(load, system, found)

    def ratio(self, load: str, system: str, other: str) -> float:
        """Median over repeats of ``system`` sentences/s / ``other`` sentences/s."""
        found = {r["repeat"]: r["result"]["items_per_s"] for r in self.runs.get((load, other), [])}
        return self._per_repeat(load, system, found)

    def load_ceiling(self, load: str, key: str = "best_items_per_s") -> float:
        """Median over repeats of a figure of ``load``'s own ceiling (rows it timed)."""
        return median(
            [c[key] for (_, name), c in self.load_ceilings.items() if name == load and key in c]
        )

    def ratio_to_load_ceiling(self, load: str, system: str) -> float:
        """Median over repeats of served sentences/s / the load's own ceiling, same repeat."""
        ceilings = self.load_ceilings.items()
        found = {rep: c["best_items_per_s"] for (rep, name), c in ceilings if name == load}
        return self._per_repeat(load, system, found)

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
        return self._per_repeat(load, system, best)

    def _latency(self, system: str, value: Callable[[dict[str, Any], Any], float | None]) -> float:
        found = {rep: c for (rep, name), c in self.ceilings.items() if name == LATENCY_LOAD}
        return self._per_repeat(LATENCY_LOAD, system, found, value)

    def latency_gap(self, system: str) -> float:
        """Median over repeats of 1 x 1 p50 minus :func:`own_p50_ms` (ms)."""
        return self._latency(system, lambda r, c: r["median_ms"] - own_p50_ms(c))

    def latency_ratio(self, system: str) -> float:
        """Median over repeats of 1 x 1 p50 / :func:`own_p50_ms`."""
        return self._latency(
            system, lambda r, c: r["median_ms"] / own_p50_ms(c) if c["batch1_p50_ms"] else None
        )

    def targets(self) -> list[tuple[str, str, str, bool]]:
        """(target, load, measured, met) for every target the run has data for."""
        out = []
        h = self.headline

        def add(name: str, load: str, value: float, met: bool, text: str = "") -> None:
            if value == value:  # not NaN: the run measured it
                out.append((name, load, text or f"{value:.2f} x", met))

        for load in TEXT_LOADS_FOR_TARGETS:
            value = self.ratio_to_load_ceiling(load, h)
            add(f"served >= {CEILING_SHARE} x the load's ceiling", load, value,
                value >= CEILING_SHARE)  # fmt: skip
        gap, ratio = self.latency_gap(h), self.latency_ratio(h)
        add(f"p50 <= {LATENCY_RATIO:g} x ORT's own per-sentence p50", LATENCY_LOAD, ratio,
            ratio <= LATENCY_RATIO, f"{ratio:.2f} x ({gap:+.2f} ms)")  # fmt: skip
        for load in self.loads:
            if self.kinds[load] != "text":
                continue
            for peer, floor in PEER_FLOORS:
                value = self.ratio(load, h, peer)
                add(f"served >= {floor} x {peer}", load, value, value >= floor)
        for load in self.loads:
            if self.kinds[load] != "text":
                value = self.image_ratio(load, h)
                add(f"served >= {CEILING_SHARE} x image tower's best in-process", load, value,
                    value >= CEILING_SHARE)  # fmt: skip
        return out
