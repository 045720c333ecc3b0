"""The perf_analyzer section of ``docs/benchmarks.md`` from a ``run_perf.sh`` results folder.

    python3 deploy/perf/perf_table.py RESULTS [--doc docs/benchmarks.md | --doc -]

``RESULTS`` is one run folder of ``run_perf.sh`` (``<ensemble>.c<N>.csv`` and ``.log``,
``run.env``) or the folder holding such runs, in which case the newest is used. Client
figures (throughput, p50/p95/p99 latency) come from each CSV (``-f``); the per-step queue
and compute times from the "Composing models" part of each log, which perf_analyzer prints
for ensembles only. The section between ``<!-- perf:begin -->`` and ``<!-- perf:end -->``
is replaced (added before ``## Method`` when the doc has none); ``--doc -`` prints it.
Standard library only, so it runs wherever ``run_perf.sh`` does.
"""

from __future__ import annotations

import argparse
import csv
import re
import sys
from dataclasses import dataclass
from pathlib import Path

BEGIN, END = "<!-- perf:begin -->", "<!-- perf:end -->"
# Pipeline order of the step names (STYLE.md); a step is shown under its stage name.
STAGES = (
    "admit_url", "fetch_image", "admit_image", "tokenize", "preprocess_image", "encode",
    "encode_text", "encode_image",
)  # fmt: skip
RUN_FILE = re.compile(r"^(?P<model>.+)\.c(?P<concurrency>\d+)\.csv$")
STEP_HEADER = re.compile(r"^\s+(?P<name>\S+), version: \S+$")
TIMES = re.compile(r"(overhead|queue|compute input|compute infer|compute output) (\d+) usec")
COMPUTE_PARTS = ("input", "infer", "output")
COUNT = re.compile(r"^\s+(Inference|Execution|Successful request) count: (\d+)$")


@dataclass(frozen=True)
class Step:
    """Server-side averages per request of one composing model, in microseconds."""

    name: str
    queue_us: float
    compute_us: float
    inferences: int
    executions: int
    successes: int

    @property
    def stage(self) -> str:
        """The stage name (``tokenize``, ``encode_image``...), or the model name if none."""
        for stage in sorted(STAGES, key=len, reverse=True):
            if self.name == stage or self.name.endswith("_" + stage):
                return stage
        return self.name

    @property
    def order(self) -> int:
        """Position in the pipeline (unknown steps last)."""
        return STAGES.index(self.stage) if self.stage in STAGES else len(STAGES)


@dataclass(frozen=True)
class Point:
    """One perf_analyzer run: an ensemble at one concurrency."""

    ensemble: str
    concurrency: int
    throughput: float
    p50_us: float
    p95_us: float
    p99_us: float
    steps: tuple[Step, ...]


def composing_steps(log: str) -> tuple[Step, ...]:
    """The "Composing models" steps of a perf_analyzer log, in pipeline order.

    Only the last measurement of the log is read (one per concurrency level).
    """
    last = log.rsplit("Request concurrency:", 1)[-1]
    if "Composing models:" not in last:
        return ()
    steps, name, counts = [], None, {}
    for line in last.split("Composing models:", 1)[1].splitlines():
        header = STEP_HEADER.match(line)
        count = COUNT.match(line)
        if header:
            name, counts = header["name"], {}
        elif count and name:
            counts[count[1]] = int(count[2])
        elif name and "Avg request latency" in line:
            times = {key: float(value) for key, value in TIMES.findall(line)}
            compute = sum(times.get(f"compute {part}", 0.0) for part in COMPUTE_PARTS)
            steps.append(
                Step(
                    name=name,
                    queue_us=times.get("queue", 0.0),
                    compute_us=compute,
                    inferences=counts.get("Inference", 0),
                    executions=counts.get("Execution", 0),
                    successes=counts.get("Successful request", 0),
                )
            )
            name = None
    return tuple(sorted(steps, key=lambda step: step.order))


def read_point(csv_path: Path) -> Point:
    """One run from its CSV (``-f``) and the log beside it."""
    match = RUN_FILE.match(csv_path.name)
    if not match:
        raise ValueError(f"{csv_path} is not named <ensemble>.c<concurrency>.csv")
    with csv_path.open(newline="") as handle:
        row = next(csv.DictReader(handle))
    log = csv_path.with_suffix(".log")
    return Point(
        ensemble=match["model"],
        concurrency=int(match["concurrency"]),
        throughput=float(row["Inferences/Second"]),
        p50_us=float(row["p50 latency"]),
        p95_us=float(row["p95 latency"]),
        p99_us=float(row["p99 latency"]),
        steps=composing_steps(log.read_text()) if log.is_file() else (),
    )


def run_folder(results: Path) -> Path:
    """``results`` itself when it is a run, else its newest run (names are UTC timestamps)."""
    if (results / "run.env").is_file() or any(results.glob("*.c*.csv")):
        return results
    runs = sorted(p for p in results.iterdir() if p.is_dir() and any(p.glob("*.c*.csv")))
    if not runs:
        raise FileNotFoundError(f"no run_perf.sh results under {results}")
    return runs[-1]


def load_run(run_dir: Path) -> tuple[dict[str, str], list[Point]]:
    """The settings (``run.env``) and every run of one folder, by ensemble and concurrency."""
    settings = {}
    env = run_dir / "run.env"
    if env.is_file():
        for line in env.read_text().splitlines():
            key, sep, value = line.partition("=")
            if sep:
                settings[key] = value.strip()
    points = [read_point(p) for p in run_dir.iterdir() if RUN_FILE.match(p.name)]
    return settings, sorted(points, key=lambda p: (p.ensemble, p.concurrency))


def _ms(us: float) -> str:
    ms = us / 1000
    return f"{ms:.1f}" if ms >= 10 else f"{ms:.2f}"


def machine_line(settings: dict[str, str]) -> str:
    """``2 cores of AMD EPYC (24 GiB), no GPU, load average 1.2 ...`` from ``run.env``."""
    cpu = settings.get("cpu") or "unknown CPU"
    cores = settings.get("cores", "?")
    memory = settings.get("memory_kib", "")
    gib = f" ({int(memory) / 2**20:.0f} GiB)" if memory.isdigit() else ""
    gpu = settings.get("gpu") or "no GPU"
    load = settings.get("load", "").split()
    busy = f", load average {load[0]} when it started" if load else ""
    return f"{cores} cores of {cpu}{gib}, {gpu}{busy}"


def ensemble_table(points: list[Point]) -> str:
    """One ensemble: a row per concurrency, a queue / compute column per step."""
    stages = []
    for point in points:
        stages += [s.stage for s in point.steps if s.stage not in stages]
    header = ["Concurrency", "Throughput (infer/s)", "p50 (ms)", "p95 (ms)", "p99 (ms)"]
    header += [f"{stage} queue / compute (ms)" for stage in stages]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for point in points:
        by_stage = {s.stage: s for s in point.steps}
        cells = [
            str(point.concurrency),
            f"{point.throughput:.1f}",
            _ms(point.p50_us),
            _ms(point.p95_us),
            _ms(point.p99_us),
        ]
        for stage in stages:
            step = by_stage.get(stage)
            cells.append(f"{_ms(step.queue_us)} / {_ms(step.compute_us)}" if step else "n/a")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def render_section(settings: dict[str, str], points: list[Point]) -> str:
    """The whole marked section: how it was measured, then a table per ensemble."""
    version = settings.get("perf_analyzer", "perf_analyzer").replace("Perf Analyzer Version", "")
    version = re.sub(r"\s*\(commit unknown\)", "", version)
    args = settings.get("args", "")
    parts = [
        BEGIN,
        "## perf_analyzer sweep (`make perf`)",
        "<!-- Generated by deploy/perf/perf_table.py from deploy/perf/run_perf.sh results. -->",
        f"Measured with `{settings.get('command', 'deploy/perf/run_perf.sh')}` on "
        f"{settings.get('started', 'an unrecorded date')}: the real perf_analyzer "
        f"{version.strip()} over gRPC, {settings.get('window', '')}, against the local "
        f"server, on {machine_line(settings)}. Each row is one perf_analyzer run:",
        f"    perf_analyzer -m <ensemble> --input-data <generated> --concurrency-range <c> {args}"
        " -H triton-grpc-protocol-x-admin-key:<key>",
        "Input data from `client/load/perf_data.py` (the benchmark's sentences; generated "
        "JPEG/PNG/WebP photos; the same photos as `data:` URIs for `IMAGE_URL`). Latencies "
        "are client-side per request; a step's queue / compute is Triton's average per "
        'request from perf_analyzer\'s "Composing models" report (compute = input + '
        "infer + output). perf_analyzer runs on the server's machine and competes with it "
        "for the CPU.",
    ]
    for ensemble in sorted({p.ensemble for p in points}):
        parts += [f"### {ensemble}", ensemble_table([p for p in points if p.ensemble == ensemble])]
    parts.append(END)
    return "\n\n".join(parts)


def replace_section(doc: str, section: str) -> str:
    """``doc`` with its marked section replaced, or the section added before ``## Method``."""
    start, end = doc.find(BEGIN), doc.find(END)
    if start >= 0 and end > start:
        return doc[:start] + section + doc[end + len(END) :]
    anchor = doc.find("\n## Method\n")
    if anchor < 0:
        return doc.rstrip("\n") + "\n\n" + section + "\n"
    return doc[: anchor + 1] + section + "\n\n" + doc[anchor + 1 :]


def main(argv: list[str] | None = None) -> int:
    """Write (or print) the section; exit 2 when the folder holds no results."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("results", type=Path, help="a run folder or the folder of runs")
    parser.add_argument("--doc", default="docs/benchmarks.md", help="markdown file, or -")
    args = parser.parse_args(argv)
    try:
        run_dir = run_folder(args.results)
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    settings, points = load_run(run_dir)
    section = render_section(settings, points)
    if args.doc == "-":
        print(section)
        return 0
    doc = Path(args.doc)
    doc.write_text(replace_section(doc.read_text() if doc.exists() else "", section))
    print(f"{doc}: perf_analyzer section from {run_dir} ({len(points)} runs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
