"""``docs/benchmarks.md``, written in full from the newest run file of each benchmark.

    .venv/bin/python -m bench.page [--out docs/benchmarks.md]

The last step of ``make bench`` (each benchmark before it writes its run file into
``bench/results/``). Nothing on the page is written by hand: the prose around the tables
is ``bench/templates/page.md``; every figure comes from the run file the section names,
so a section can be old (its date says so) but never edited. The ``make perf`` table is
carried over from the page as ``make perf`` wrote it. The runs' history stays in
``bench/results/``; ``bench/results/README.md`` lists what they decided.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

from bench import docs_text, gateway_call
from bench.common import RESULTS, ROOT, render_template, table
from bench.docs_text import times
from bench.faults import cancels
from bench.gpu import report as gpu_report
from bench.rerank import report as rerank_report
from bench.summary import Summary

DOC = ROOT / "docs" / "benchmarks.md"
STAMP = re.compile(r"(\d{4})-?(\d{2})-?(\d{2})T(\d{6})Z\.json$")


def newest(prefix: str, results: Path = RESULTS) -> tuple[str, dict[str, Any]] | None:
    """(path from the root, contents) of the newest ``<prefix>-<stamp>.json``, or None.

    Newest by the stamp in the name (a clone's file times are all the same).
    """
    found = []
    for path in results.glob(f"{prefix}-*.json"):
        match = STAMP.search(path.name)
        if match and path.name[: match.start()].rstrip("-") == prefix:
            found.append(("".join(match.groups()), path))
    if not found:
        return None
    path = max(found)[1]
    return f"bench/results/{path.name}", json.loads(path.read_text())


def _yes(met: bool) -> str:
    return "yes" if met else "**no**"


class Page:
    """The sections, and the targets they report for the headline table."""

    def __init__(self) -> None:
        self.targets: list[list[str]] = []
        self.sections: list[str] = []

    def target(self, question: str, target: str, measured: str, met: bool, source: str) -> None:
        """One row of the headline table."""
        self.targets.append([question, target, measured, _yes(met), f"`{Path(source).name}`"])

    def section(self, title: str, source: str, date: str, lines: list[str]) -> None:
        """A section: its title, the run file and date it comes from, its lines."""
        head = f"## {title}\n\nFrom `{source}` (run of {date})."
        self.sections.append("\n".join([head, "", *lines]).rstrip())


def _text_and_images(page: Page, source: str, results: dict[str, Any]) -> Summary:
    s = Summary(results)
    date = results["meta"]["started"]
    for name, load, value, met in s.targets():
        question = "images" if "image" in name else "text"
        page.target(question, f"{name} ({load})", value, met, source)
    lines = ["Each load's own in-process ceiling (the best of four ways to run the rows it timed,"
             " tokenizer included):", "", docs_text.load_ceiling_table(s), "",
             "Sentences (images) per second of every system at every load, and its share of the"
             " load's ceiling (the text loads) or of the image tower's best in-process rate:", "",
             _systems_table(s), "", "![throughput](bench-throughput.png)"]
    page.section("Text and images against the ceiling and the peers", source, date, lines)
    return s


def _systems_table(s: Summary) -> str:
    """One row per load, one column per system: items/s and the ratio to the ceiling."""
    rows = []
    for load in s.loads:
        cells = [load]
        for system in s.systems:
            rate = s.stat(load, system, "items_per_s") if (load, system) in s.runs else None
            if rate is None:
                cells.append("")
                continue
            share = (s.ratio_to_load_ceiling(load, system) if s.kinds[load] == "text"
                     else s.image_ratio(load, system))
            cells.append(f"{rate:.1f} ({share:.2f})" if share == share else f"{rate:.1f}")
        rows.append(cells)
    return table(["Load", *s.systems], rows)


def _rerank(page: Page, source: str, results: dict[str, Any]) -> None:
    text = rerank_report.render(rerank_report.RerankSummary(results))
    body = [line for line in text.splitlines() if not line.startswith(("<!--", "## "))]
    page.section("Rerank", source, results["meta"]["started"], body)


def _overload(page: Page, found: dict[str, tuple[str, dict]]) -> None:
    if "seed" in found:
        source, seed = found["seed"]
        rows = [[config, protocol, f"{r['answered']} / {r['sent']}", f"{r['answered_per_s']:.0f}",
                 f"{r['p50_ms']:.0f} / {r['p99_ms']:.0f}"]
                for config in ("shipped", "off", "interactive")
                for protocol, r in seed[config].items() if protocol != "knobs"]
        for verdict in seed["verdicts"]:
            head, measured = verdict.split(": ", 1)
            page.target("overload", f"500 plain clients x 20 over {head.split()[-1]}: every "
                        "request answered, >= 0.9 x the rate with admission off", measured,
                        head.startswith("ok"), source)
        page.section(
            "Overload: 500 plain clients (`bench.faults.seed`)", source, seed["started"],
            [table(["config", "protocol", "answered / sent", "answered/s", "p50 / p99 ms"], rows)],
        )
    if "cancels" in found:
        source, c = found["cancels"]
        minutes = c["per_minute"]
        first, last = minutes[0], minutes[-1]
        late = sum(m["late"] + m["failed"] for m in minutes)
        page.target("overload", "a fifth of clients cancel: refusals of the last minute <= the "
                    "first's (+1 %), every answer in time, none failed", f"{first['refused']} then "
                    f"{last['refused']} refused, {late} late or failed",
                    cancels.target_met(minutes), source)
        page.section(
            "Overload: a fifth of the clients cancel (`bench.faults.cancels`)", source,
            c["started"],
            [f"{c['minutes']:.0f} min at {c['factor']} x {c['sustainable_per_s']:.0f} req/s, "
             f"{c['gave_up']} requests given up by their clients; refused per minute: "
             + ", ".join(str(m["refused"]) for m in minutes) + "; answered late or failed: "
             f"{late}" + _lateness(c) + "."],
        )
    if "overload-cpu" in found:
        source, o = found["overload-cpu"]
        rows = [[r["config"], r["load"], f"{r['factor']} x", str(r["sent"]), str(r["good"]),
                 str(r["refused"]), str(r["past_deadline"]), f"{r['goodput']:.0f}",
                 f"{r['accepted_ms'].get('p50', 0):.0f} / {r['accepted_ms'].get('p99', 0):.0f}"]
                for r in o["records"] if "factor" in r]
        page.section(
            "Overload: open loop past the sustainable rate (`bench.faults.overload`)", source,
            o["meta"]["started"],
            [table(["config", "load", "rate", "sent", "good", "refused", "past deadline",
                    "goodput/s", "accepted p50 / p99 ms"], rows)],
        )


def _soak(page: Page, found: dict[str, tuple[str, dict]]) -> None:
    if "soak-cpu" in found:
        source, soak = found["soak-cpu"]
        rows = [[name, str(r["requests"]), f"{r['req_per_s']:.1f}", str(r["errors"])]
                for name, r in soak["loads"].items()]
        errors = sum(r["errors"] for r in soak["loads"].values())
        page.target("faults", "10 min of mixed load: no error", str(errors), errors == 0, source)
        page.section("Memory soak (`bench.faults.soak`)", source, soak["meta"]["started"],
                     [table(["load", "requests", "req/s", "errors"], rows), "",
                      "![memory](bench-soak.png)"])


def _ratios(page: Page, found: dict[str, tuple[str, dict]]) -> None:
    if "index-rate" in found:
        source, rate = found["index-rate"]
        rows = []
        for kind in ("text", "images"):
            if kind in rate:
                median = rate[kind]["median"]
                rows.append([kind, times(median), times(rate[kind]["pooled"])])
                page.target("indexing", f"indexer {kind} >= 0.9 x the best load", times(median),
                            median >= 0.9, source)
        page.section("Corpus indexer (`bench.index_rate`)", source,
                     rate.get("started", Path(source).stem[-18:]),
                     ["The indexer's rows/s over the best load of the same rows on one server:",
                      "", table(["rows", "median of repeats", "pooled"], rows)])
    if "long-documents" in found:
        source, docs = found["long-documents"]
        rows = [[model, way, f"{r['recall@10']:.3f}", f"{r['recall@1']:.3f}", str(r["vectors"])]
                for model, ways in docs["recall"].items() for way, r in ways.items()]
        cost = docs["cost"]
        for gate, met in docs["gates"].items():
            page.target("long documents", f"{gate.replace('_', ' ')} >= 0.9 x plain rows",
                        times(cost[gate]), met, source)
        page.section("Long documents (`bench.long_documents`)", source, docs["started"],
                     [table(["model", "way", "recall@10", "recall@1", "vectors"], rows), "",
                      "Cost: " + ", ".join(f"{k} {v:.1f} rows/s"
                                           for k, v in cost["rows_per_s"].items())])
    if "clip-speed" in found:
        source, speed = found["clip-speed"]
        rows = []
        for kind, loads in speed["results"].items():
            ratios = [loads[w]["ratio"] for w in ("images", "texts")]
            rows.append([kind, *map(times, ratios)])
            page.target("OpenCLIP kinds", f"{kind}: images and texts >= 0.9 x open_clip",
                        " / ".join(map(times, ratios)), min(ratios) >= 0.9, source)
        how = []
        if "client_in_flight" in speed:
            how = ["", f"Each load: {speed['images']} images, {speed['texts']} texts. Served: one "
                   "gRPC client call with all of them (requests of the ensemble's "
                   f"max_batch_size, {speed['client_in_flight']} in flight: the client's "
                   f"default); open_clip: batches of {speed['batch']} in this process, "
                   f"{speed['torch_threads']} torch threads."]
        page.section("OpenCLIP tower kinds served against open_clip (`bench.open_clip_speed`)",
                     source, speed["started"],
                     [table(["kind", "images ÷ open_clip", "texts ÷ open_clip"], rows), *how])


def _admission(page: Page, found: dict[str, tuple[str, dict]]) -> None:
    """Admission's estimate against what happened; queries beside the indexer."""
    if "admission-estimate" in found:
        source, run = found["admission-estimate"]
        loads = run["loads"]
        rows = [[name, str(r["n"]), f"{r['p10']:.2f}", f"{r['p50']:.2f}", f"{r['p90']:.2f}"]
                for name, r in loads.items()]
        worst = (min(r["p10"] for r in loads.values()), max(r["p90"] for r in loads.values()))
        page.target("admission", "actual / expected wait p10-p90 within 0.5-2, every load",
                    f"{worst[0]:.2f}-{worst[1]:.2f}", worst[0] >= 0.5 and worst[1] <= 2, source)
        page.section("Admission's estimate (`bench.admission_estimate`)", source,
                     Path(source).stem[-16:],
                     [table(["load", "requests", "p10", "p50", "p90"], rows)])
    if "queries-beside-index" in found:
        source, run = found["queries-beside-index"]
        beside, ratio = run["queries_beside_index"], run["index"]["rate_ratio"]
        page.target("admission", "queries stating 500 ms beside the indexer: >= 99 % in time",
                    f"{beside['in_time_share']:.1%}", beside["in_time_share"] >= 0.99, source)
        page.target("admission", "the indexer beside the queries >= 0.8 x alone", times(ratio),
                    ratio >= 0.8, source)
        alone = run["queries_alone"]
        page.section("Queries beside the indexer (`bench.queries_beside_index`)", source,
                     Path(source).stem[-16:],
                     [f"Queries in time alone {alone['in_time']} / {alone['sent']} (p99 "
                      f"{alone['p99_ms']:.0f} ms), beside the indexer {beside['in_time']} / "
                      f"{beside['sent']} (p99 {beside['p99_ms']:.0f} ms); the indexer "
                      f"{run['index']['alone_s']:.1f} s alone, {run['index']['beside_s']:.1f} s "
                      f"beside them ({times(ratio)})."])


def _lateness(cancels: dict) -> str:
    """How late the latest answer came, where the run file says."""
    minutes = cancels["per_minute"]
    if "late_max_ms" not in minutes[0]:
        return ""
    failed = [str(m["minute"]) for m in minutes if m["failed"]]
    worst = max(m["late_max_ms"] for m in minutes)
    died = cancels.get("server_exit")
    return (f" (the latest {worst:.0f} ms past its deadline"
            + (f"; failed in minutes {', '.join(failed)}" if failed else "")
            + (f"; Triton died, exit status {died}: docs/security.md, gRPC on Triton 2.51"
               if died is not None else "") + ")")


def measured_apart(results: dict) -> bool:
    """Whether a ``bench.gateway`` run measured the HTTP server and the call on their own."""
    return gateway_call.CALL_PART in results["parts"]["1"]


def gateway_section(results: dict) -> str:
    """The gateway's section: a ``bench.gateway`` run file's rates, CPU by part and scaling."""
    rows = []
    for load, row in results["summary"].items():
        for way in ("triton", "gateway"):
            r = row[way]
            added = [times(row["throughput_ratio"]),
                     f"+{row['p50_added_ms']:.1f} ({row['p50_ratio']:.1f} x)"]
            rows.append([load, way, f"{r['req_per_s']:.1f}", f"{r['p50_ms']:.1f}",
                         f"{r['p99_ms']:.1f}", *(added if way == "gateway" else ["", ""]),
                         f"{r['triton_cpu_ms_per_req']:.2f}", f"{r['gateway_cpu_ms_per_req']:.2f}"])
    rates = table(["Load", "Way", "req/s", "p50 ms", "p99 ms", "gateway ÷ triton req/s",
                   "p50 added ms", "Triton CPU ms / req", "gateway CPU ms / req"], rows)
    parts = results["parts"]
    total = {size: results["summary"][load]["gateway"]["gateway_cpu_ms_per_req"] * 1000
             for size, load in (("1", "16x1"), ("32", "4x32"))}
    timed = {size: sum(v for n, v in p.items() if not n.startswith("base64"))
             for size, p in parts.items()}
    rows = [[name, f"{parts['1'][name]:.1f}", f"{parts['32'][name]:.1f}"] for name in parts["1"]]
    # Run files before 2026-12-05T18 did not measure the two servers' shares on their own.
    rest = ("the rest: the ASGI app around `embeddings`, both halves on one event loop"
            if measured_apart(results) else
            "the rest: uvicorn (HTTP server), aiohttp (the call to Triton), the event loop")
    rows += [[rest, f"{total['1'] - timed['1']:.0f}", f"{total['32'] - timed['32']:.0f}"],
             ["total, measured", f"{total['1']:.0f}", f"{total['32']:.0f}"]]
    errors = sum(row["errors"] for row in results["summary"].values())
    return render_template("gateway_section.md", r=results, m=results["machine"], rates=rates,
                           apart=measured_apart(results),
                           errors=errors, total=total,
                           parts=table(["Part", "1 text", "32 texts"], rows)).rstrip()


def _gateway(page: Page, source: str, results: dict[str, Any]) -> None:
    summary = results["summary"]
    measured = [times(summary[load]["throughput_ratio"]) for load in ("16x1", "4x32")]
    measured += [f"{summary['16x1']['gateway']['gateway_cpu_ms_per_req']:.2f} ms"]
    for (name, met), value in zip(results["gates"].items(), measured, strict=True):
        page.target("OpenAI gateway", name, value, met, source)
    body = [line for line in gateway_section(results).splitlines()
            if not line.startswith(("<!--", "## ", "- ", "Errors:"))]
    page.section("The OpenAI gateway's cost (`bench.gateway`)", source, results["started"], body)


def _gpu(page: Page, source: str, results: dict[str, Any]) -> None:
    text = gpu_report.render_gpu_section([results])
    # The best rows and the summaries stay; every measurement and every photo: the run file.
    every = re.compile(r"### Every measurement.*?(?=### |\Z)", re.S)
    body, photos = [], False
    for line in every.sub("", text).splitlines():
        photos = line.startswith("| photo |") or (photos and line.startswith("|"))
        if not photos and not line.startswith(("<!--", "## ")):
            body.append(line)
    page.section("GPU (`bench.gpu`)", source, results["meta"].get("started", "?"), body)


def build(previous: str = "", results: Path = RESULTS) -> str:
    """The whole page, from the newest run files under ``results``."""
    def one(prefix: str) -> tuple[str, dict] | None:
        return newest(prefix, results)

    page = Page()
    found = {p: f for p in ("seed", "cancels", "overload-cpu", "soak-cpu", "index-rate",
                            "long-documents", "clip-speed", "admission-estimate",
                            "queries-beside-index")
             if (f := one(p))}
    summary = _text_and_images(page, *f) if (f := one("cpu-full")) else None
    if (f := one("rerank-cpu-full")):
        _rerank(page, *f)
    _overload(page, found)
    _ratios(page, found)
    _admission(page, found)
    _soak(page, found)
    if (f := one("gateway")) and "gates" in f[1]:
        _gateway(page, *f)
    if (f := one("gpu-all")):
        _gpu(page, *f)
    perf = re.search(re.escape(docs_text.PERF_BEGIN) + r".*?" + re.escape(docs_text.PERF_END),
                     previous, re.S)
    text = render_template(
        "page.md",
        machine=summary.meta["machine"] if summary else {},
        targets=table(["Question", "Target", "Measured", "Met", "Run file"], page.targets),
        sections=page.sections,
        machine_table=docs_text.machine_table(summary) if summary else "",
        perf=perf.group(0) if perf else "",
    )
    return re.sub(r"\n{3,}", "\n\n", text)


def main(argv: list[str] | None = None) -> None:
    """Write the page."""
    parser = argparse.ArgumentParser(prog="python -m bench.page", description=__doc__)
    parser.add_argument("--out", type=Path, default=DOC)
    args = parser.parse_args(argv)
    previous = args.out.read_text() if args.out.exists() else ""
    text = build(previous)
    args.out.write_text(text)
    print(f"wrote {args.out}: {text.count(chr(10))} lines")


if __name__ == "__main__":
    main()
