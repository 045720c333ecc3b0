"""The rerank section of ``docs/benchmarks.md`` from a ``bench.rerank`` results dict.

Medians over repeats; ratios are taken inside each repeat, as in the rest of the page.
"""

from __future__ import annotations

from typing import Any

from bench.common import median, render_template, table

BEGIN, END = "<!-- rerank:begin -->", "<!-- rerank:end -->"
HEADLINE, CEILING, PEER = "triton-grpc", "ceiling", "fastapi-ce"


def _rate(run: dict[str, Any]) -> float:
    result = run["result"]
    return result["best_items_per_s"] if run["system"] == CEILING else result["items_per_s"]


class RerankSummary:
    """Medians and in-repeat ratios of one rerank run."""

    def __init__(self, results: dict[str, Any]):
        """Index the runs by (system, repeat)."""
        self.meta = results["meta"]
        self.runs = {(r["system"], r["repeat"]): r for r in results["runs"]}
        self.systems = list(dict.fromkeys(r["system"] for r in results["runs"]))

    def values(self, system: str, key: str) -> list[float]:
        """``key`` of ``system``'s result in every repeat."""
        return [
            r["result"][key]
            for (s, _), r in self.runs.items()
            if s == system and key in r["result"]
        ]

    def foreign(self, system: str) -> float:
        """Median share of the machine other processes used while ``system`` ran."""
        return median([r["foreign_cpu"] for (s, _), r in self.runs.items() if s == system])

    def stat(self, system: str, key: str) -> float:
        """Median over repeats of one client-side figure."""
        return median(self.values(system, key))

    def rate(self, system: str) -> float:
        """Median pairs/s (the ceiling: its best way)."""
        return median([_rate(r) for (s, _), r in self.runs.items() if s == system])

    def ratio(self, system: str, other: str) -> float:
        """Median over repeats of ``system`` pairs/s / ``other`` pairs/s."""
        values = []
        for (name, repeat), run in self.runs.items():
            peer = self.runs.get((other, repeat))
            if name == system and peer and _rate(peer):
                values.append(_rate(run) / _rate(peer))
        return median(values)


def _x(value: float) -> str:
    return "" if value != value else f"{value:.2f} x"


def render(summary: RerankSummary) -> str:
    """The markdown section, markers included."""
    meta = summary.meta
    rows = []
    for system in summary.systems:
        if system == CEILING:
            ways = "/".join(sorted(set(summary.values(CEILING, "best"))))
            detail = ", ".join(
                f"{way} {median(summary.values(CEILING, f'{way}_items_per_s')):.1f}"
                for way in ("batch1", "sorted", "planner", "parallel")
                if summary.values(CEILING, f"{way}_items_per_s")
            )
            rows.append(
                [f"ceiling ({ways}; {detail})", f"{summary.rate(system):.1f}", *[None] * 5,
                 _x(summary.ratio(HEADLINE, system)), f"{summary.foreign(system):.0%}"]
            )
            continue
        name = f"**{system}**" if system == HEADLINE else system
        errors = sum(summary.values(system, "errors"))
        rows.append(
            [name, f"{summary.rate(system):.1f}", f"{summary.stat(system, 'qps'):.1f}",
             f"{summary.stat(system, 'median_ms'):.1f}", f"{summary.stat(system, 'p95_ms'):.1f}",
             str(errors), _x(summary.ratio(system, CEILING)),
             "" if system == HEADLINE else _x(summary.ratio(HEADLINE, system)),
             f"{summary.foreign(system):.0%}"]
        )
    header = ["System", "pairs/s", "req/s", "p50 ms", "p95 ms", "errors", "÷ ceiling",
              f"{HEADLINE} ÷ this", "other CPU"]
    return render_template(
        "rerank_section.md",
        begin=BEGIN,
        end=END,
        meta=meta,
        entry=meta.get("entry", {}),
        table=table(header, rows),
    ).rstrip("\n")
