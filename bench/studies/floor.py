"""The 1 x 1 latency of the text model, broken down part by part, beside its floors.

    python -m bench.studies.floor [--repeats 5] [--protocol grpc --protocol http]
        [--variant "intra_op_threads=1" --variant "count=1" ...] [--json PATH]

Builds the bench repository with the shipped text settings (``make serve``'s) and adds,
in the same server:

- ``<model>-floor``: the text ensemble whose encoder is an empty Python model
  (``bench/studies/floor_model``: same config, reads ``TEXT``, returns zeros), so its
  p50 is what Triton, the ensemble step, the Python backend's round trip, the protocol
  and the client cost before any work;
- one copy of the encoder per ``--variant`` (``KEY=VALUE;...``: encoder config
  parameters such as ``intra_op_threads`` or ``spin_duration_us``, ``count`` for the
  instances, ``code=REV`` for the stub code of a git revision), each with its own
  ensemble, to try a change, or compare before and after one, in the same run.

Each repeat measures, in a rotated order, one client sending one sentence at a time to
every ensemble and straight to the encoders (no ensemble step), over each protocol;
and in-process on the same sentences: ONNX Runtime's batch-1 run alone, ONNX Runtime
with the tokenizer as a program embedding one query would call them (the reference of
the 1.2 x target), and the encoder stub's own code (``TextEncoder.read`` + ``embed``).
The served encoders time their executions from inside (``EMBED_STEP_TIMES``), and
Triton's statistics time each step from outside, so the table splits a request into:
client and protocol, the ensemble step, queueing, Triton's input and output copies,
the Python backend's round trip, reading the request, tokenizing and the rest of the
embed call, ONNX Runtime's run, and the responses. Prints medians; ``--json`` saves
every figure.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import re
import secrets
import shutil
import statistics
import subprocess
import tarfile
import time
from contextlib import ExitStack
from pathlib import Path

from bench.ceiling import config_parameters, make_session, text_ceiling
from bench.common import logger
from bench.loads import text_loads
from bench.manifest import BUILD, ROOT, TEXT_MODEL, bench_manifest
from client.load.loadgen import LoadSpec, run_triton_load
from client.load.perf_data import write_perf_data
from client.load.workload import text_pool, text_requests
from generator.admin import KEY_ENV
from generator.build import build_repository
from generator.triton_local import TritonLaunch, TritonPorts, TritonProcess, free_ports

FLOOR = f"{TEXT_MODEL}-floor"
PERF_ANALYZER = BUILD / "tools" / "perf_analyzer" / "perf_analyzer"  # `make perf-analyzer`
FLOOR_MODEL = Path(__file__).with_name("floor_model") / "model.py"
RATE_SPEC = LoadSpec(8, 1, 250, 5, 12.0)  # 8 clients x 1 text: single-item arrivals
MEANS: dict[str, list[float]] = {"ort_own": [], "stub_code": []}  # per repeat, ms
PHASES = ("read_us", "embed_other_us", "ort_us", "respond_us", "total_us")

log = logger("bench")


def add_copy(repo: Path, name: str, encoder_dir: Path | None = None, edit=lambda c: c) -> None:
    """``<name>`` + ``<name>_encode``: the text ensemble and a copy of its encoder.

    ``encoder_dir`` holds the copy's version folder (default: the real encoder's, linked
    file by file); ``edit`` changes the copied encoder config.
    """
    real, copy = repo / f"{TEXT_MODEL}_encode", repo / f"{name}_encode"
    shutil.rmtree(copy, ignore_errors=True)
    if encoder_dir is None:
        shutil.copytree(real / "1", copy / "1", copy_function=os.link, ignore=_pycache)
    else:
        (copy / "1").mkdir(parents=True)
        for file in (f for f in encoder_dir.iterdir() if f.is_file()):
            shutil.copy(file, copy / "1" / file.name)
    config = (real / "config.pbtxt").read_text()
    config = re.sub(r'^name: ".*"', f'name: "{name}_encode"', config, count=1, flags=re.M)
    (copy / "config.pbtxt").write_text(edit(config))
    ensemble = (repo / TEXT_MODEL / "config.pbtxt").read_text()
    if "_tokenize" in ensemble:
        raise SystemExit("bench.studies.floor needs the shipped fused_tokenize ensemble (one step)")
    ensemble = ensemble.replace(f'"{TEXT_MODEL}_encode"', f'"{name}_encode"')
    ensemble = re.sub(r'^name: ".*"', f'name: "{name}"', ensemble, count=1, flags=re.M)
    (repo / name / "1").mkdir(parents=True, exist_ok=True)
    (repo / name / "config.pbtxt").write_text(ensemble)


def add_floor(repo: Path) -> None:
    """``<model>-floor``: the text ensemble with the empty model in its encoder's place."""
    add_copy(repo, FLOOR, FLOOR_MODEL.parent)


def _pycache(_folder: str, names: list[str]) -> list[str]:
    return [n for n in names if n == "__pycache__"]


def variant_code(variant: str) -> str:
    """The git revision a variant's ``code=REV`` names, or ``""``."""
    pairs = dict(p.split("=", 1) for p in variant.split(";") if p.strip())
    return pairs.get("code", "")


def use_code(version: Path, revision: str) -> None:
    """Serve ``version`` with the ``embed_runtime`` package of a git revision (before/after)."""
    shutil.rmtree(version / "embed_runtime")
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", revision, "embed_runtime"],
        capture_output=True,
        check=True,
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(version, filter="data")


def variant_edit(variant: str):
    """The config edit of ``KEY=VALUE;...``: parameters by key, ``count`` for instances.

    ``code=REV`` is not a config edit (:func:`use_code`) and is skipped here.
    """
    pairs = [p.split("=", 1) for p in variant.split(";") if p.strip()]
    pairs = [(key, value) for key, value in pairs if key != "code"]

    def edit(config: str) -> str:
        for key, value in pairs:
            if key == "count":
                config, n = re.subn(r"count: \d+", f"count: {int(value)}", config)
            else:
                pattern = rf'(key: "{re.escape(key)}"\s*value \{{ string_value: )"[^"]*"'
                config, n = re.subn(pattern, rf'\1"{value}"', config)
            if n != 1:
                raise SystemExit(f"--variant {variant!r}: {key} not found once in the config")
        return config

    return edit


def stub_code_p50(repo: Path, sentences: list[str]) -> float:
    """p50 ms of the fused encoder's own code on one sentence at a time, in-process."""
    import numpy as np

    from embed_runtime.engines.ort_encoder import EncoderParams, OrtEncoder
    from embed_runtime.engines.text_encoder import TextEncoder

    folder = repo / f"{TEXT_MODEL}_encode"
    raw = config_parameters(folder)
    params = EncoderParams.from_parameters(raw)  # alone: the session a lone request gets
    encoder = OrtEncoder(str(folder / "1" / params.onnx_file), params)
    text = TextEncoder.from_parameters(raw, str(folder / "1"), encoder)
    rows = [np.array([[s.encode()]], dtype=object) for s in sentences]
    times = []
    for i, row in enumerate(rows * 2):
        start = time.perf_counter()
        text.embed([text.read(row, {})])
        if i >= len(rows):  # the first pass warms up
            times.append(time.perf_counter() - start)
    MEANS["stub_code"].append(statistics.fmean(times) * 1e3)
    return statistics.median(times) * 1e3


def ort_own_p50(repo: Path, sentences: list[str]) -> float:
    """p50 ms of tokenizing one sentence and running it, as a program embedding one query.

    ONNX Runtime's default session (the ceiling's), the served tokenizer file read by
    ``tokenizers`` with the served truncation; no checks, no pooling beyond the graph's.
    """
    import numpy as np
    from tokenizers import Tokenizer

    folder = repo / f"{TEXT_MODEL}_encode"
    raw = config_parameters(folder)
    session = make_session(folder / "1" / raw.get("onnx_file", "model.onnx"))
    names = [i.name for i in session.get_inputs()]
    tokenizer = Tokenizer.from_file(str(folder / "1" / raw["tokenizer_file"]))
    tokenizer.enable_truncation(int(raw["max_length"]))
    times = []
    for i, sentence in enumerate(sentences * 2):
        start = time.perf_counter()
        encoding = tokenizer.encode(sentence)
        ids = np.array([encoding.ids], dtype=np.int64)
        feed = {
            "input_ids": ids,
            "attention_mask": np.array([encoding.attention_mask], dtype=np.int64),
            "token_type_ids": np.array([encoding.type_ids], dtype=np.int64),
        }
        session.run(None, {k: v for k, v in feed.items() if k in names})
        if i >= len(sentences):
            times.append(time.perf_counter() - start)
    MEANS["ort_own"].append(statistics.fmean(times) * 1e3)
    return statistics.median(times) * 1e3


def perf_analyzer_run(
    binary: Path, url: str, model: str, data: Path, key: str, concurrency: int = 1
) -> tuple[float, float]:
    """(p50 ms, requests/s) of ``model`` over gRPC, timed by perf_analyzer (C++ client)."""
    csv_path = data.parent / f"{model}.c{concurrency}.csv"
    command = [
        str(binary),
        *("-m", model, "-u", url, "-i", "grpc", "--input-data", str(data)),
        *("--concurrency-range", str(concurrency), "--request-count", str(250 * concurrency)),
        "--percentile=50",
        *("-f", str(csv_path), "-H", f"triton-grpc-protocol-x-admin-key:{key}"),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    if done.returncode:
        raise RuntimeError(f"perf_analyzer failed: {done.stdout[-2000:]}{done.stderr[-2000:]}")
    with open(csv_path, encoding="utf-8") as rows:
        (row,) = list(csv.DictReader(rows))
    return float(row["p50 latency"]) / 1e3, float(row["Inferences/Second"])


class StepLines:
    """The lines the served encoders write (``EMBED_STEP_TIMES``), read window by window."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.seen: dict[Path, int] = {}

    def mark(self) -> None:
        """Remember how far every file was read."""
        self.seen = {path: path.stat().st_size for path in self.folder.glob("*.tsv")}

    def means(self, model: str) -> dict[str, float]:
        """Mean of each phase over ``model``'s one-request executions since :meth:`mark`."""
        rows: list[dict[str, float]] = []
        for path in self.folder.glob(f"{model}.*.tsv"):
            with open(path, encoding="utf-8") as lines:
                header = lines.readline().rstrip("\n").split("\t")
                lines.seek(max(self.seen.get(path, 0), lines.tell()))
                for line in lines:
                    row = dict(zip(header, map(float, line.split("\t")), strict=True))
                    if row["requests"] == 1:
                        rows.append(row)
        if not rows:
            return {}
        out = {phase: statistics.fmean(r[phase] for r in rows) / 1e3 for phase in PHASES}
        for phase in ("ort_us", "total_us"):  # to set beside in-process p50s
            out[f"{phase[:-3]}_p50_us"] = statistics.median(r[phase] for r in rows) / 1e3
        return out


def breakdown(result, ensemble: str, encoder: str, inside: dict[str, float]) -> dict[str, float]:
    """One served load's means, part by part (ms): outside, Triton's and the stub's own."""
    stats = {m.name: m for m in result.server or []}
    enc = stats[encoder]
    out = {
        "client_mean": result.mean_ms,
        "queue": enc.avg_queue_ms,
        "compute_input": enc.avg_compute_input_ms,
        "compute_infer": enc.avg_compute_infer_ms,
        "compute_output": enc.avg_compute_output_ms,
    }
    top = stats[ensemble] if ensemble in stats else enc
    out["triton_request"] = top.avg_request_ms
    out["client_and_protocol"] = result.mean_ms - top.avg_request_ms
    step_sum = sum(out[k] for k in ("queue", "compute_input", "compute_infer", "compute_output"))
    out["ensemble_step"] = top.avg_request_ms - step_sum if ensemble in stats else 0.0
    for phase, value in inside.items():
        out[f"stub_{phase.removesuffix('_us')}"] = value
    if inside:
        out["backend_round_trip"] = enc.avg_compute_infer_ms - inside["total_us"]
    return out


def main(argv=None) -> int:
    """Measure, print and optionally save; returns 0."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--protocol", action="append", choices=("grpc", "http"))
    parser.add_argument("--variant", action="append", default=[], help="KEY=VALUE;...")
    parser.add_argument("--perf-analyzer", type=Path, default=PERF_ANALYZER)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    protocols = args.protocol or ["grpc", "http"]
    repo = BUILD / "floor-repo"
    build_repository(bench_manifest("cpu", False, {}), repo, log=log)
    add_floor(repo)
    variants = {f"{TEXT_MODEL}-v{i + 1}": v for i, v in enumerate(args.variant)}
    for name, variant in variants.items():
        add_copy(repo, name, edit=variant_edit(variant))
        if variant_code(variant):
            use_code(repo / f"{name}_encode" / "1", variant_code(variant))
    ensembles = [TEXT_MODEL, *variants, FLOOR]
    pool = text_pool()
    spec = next(load.spec for load in text_loads(False) if load.key == "1 x 1")
    requests = text_requests(pool, 1, spec.warmup_requests + spec.requests_per_client)
    in_process = ("ort_batch1", "ort_own", "stub_code")
    direct = (TEXT_MODEL, FLOOR)  # also called straight, without the ensemble step
    served = [
        f"{p} {m}"
        for p in protocols
        for e in ensembles
        for m in ((e, f"{e}_encode") if e in direct else (e,))
    ]
    timed_by_pa = []
    if args.perf_analyzer.exists():
        timed_by_pa = [f"perf_analyzer {e}" for e in (TEXT_MODEL, FLOOR)]
        timed_by_pa.append(f"perf_analyzer {FLOOR} 8 x 1")
        (data,) = write_perf_data(BUILD / "floor-work" / "perf-data", "text")
    else:
        log(f"{args.perf_analyzer} not found (make perf-analyzer): no perf_analyzer rows")
    figures: dict[str, list[float]] = {name: [] for name in (*in_process, *served, *timed_by_pa)}
    parts: dict[str, list[dict[str, float]]] = {name: [] for name in served}
    times = StepLines(BUILD / "floor-work" / "step-times")
    shutil.rmtree(times.folder, ignore_errors=True)
    os.environ["EMBED_STEP_TIMES"] = str(times.folder)
    with ExitStack() as stack:
        ports = TritonPorts(*free_ports(3))
        key = os.environ.setdefault(KEY_ENV, secrets.token_urlsafe(32))
        models = tuple(m for e in ensembles for m in (e, f"{e}_encode"))
        launch = TritonLaunch(repo, ports, load_models=models, admin_key=key)
        process = TritonProcess(launch, BUILD / "floor-work").start()
        stack.callback(process.stop)
        process.wait_ready(timeout_s=300)
        order = list(figures)
        for repeat in range(args.repeats):
            shift = repeat * len(order) // args.repeats
            for name in order[shift:] + order[:shift]:
                if name == "ort_batch1":
                    session = make_session(repo / f"{TEXT_MODEL}_encode" / "1" / "model.onnx")
                    p50 = text_ceiling(repo, TEXT_MODEL, pool, "cpu", 0, session).batch1_p50_ms
                    del session
                elif name == "ort_own":
                    p50 = ort_own_p50(repo, pool[:250])
                elif name == "stub_code":
                    p50 = stub_code_p50(repo, pool[:250])
                elif name.startswith("perf_analyzer "):
                    url, model = f"127.0.0.1:{ports.grpc}", name.split()[1]
                    clients = 8 if name.endswith(" 8 x 1") else 1
                    run = perf_analyzer_run(args.perf_analyzer, url, model, data, key, clients)
                    p50 = run[1] if clients > 1 else run[0]
                elif name.endswith(" 8 x 1"):  # a rate (items/s), not a p50
                    protocol, model = name.split(" ")[:2]
                    port = ports.grpc if protocol == "grpc" else ports.http
                    url = f"127.0.0.1:{port}"
                    items = [[s.encode()] for s in pool]
                    result = run_triton_load(url, protocol, model, "TEXT", items, RATE_SPEC)
                    p50 = result.items_per_s
                else:
                    protocol, model = name.split(" ")
                    port = ports.grpc if protocol == "grpc" else ports.http
                    times.mark()
                    result = run_triton_load(
                        f"127.0.0.1:{port}", protocol, model, "TEXT", requests, spec, "1 x 1"
                    )
                    p50 = result.median_ms
                    ensemble = model.removesuffix("_encode")
                    encoder = f"{ensemble}_encode"
                    inside = times.means(encoder)
                    parts[name].append(breakdown(result, model, encoder, inside))
                figures[name].append(p50)
                log(f"repeat {repeat + 1} {name:44s} {p50:8.2f}")
    report(figures, parts, args.repeats, variants)
    if args.json:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        record = {
            "run": stamp,
            "protocols": protocols,
            "variants": variants,
            "p50_ms": figures,
            "parts_ms": parts,
            "in_process_mean_ms": MEANS,
        }
        args.json.write_text(json.dumps(record, indent=1))
    return 0


def report(figures, parts, repeats: int, variants: dict[str, str]) -> None:
    """Print the medians, the ratios to ORT's own p50 and each served row's parts."""
    own = figures["ort_own"]
    print(f"medians of {repeats} repeats, 1 client x 1 sentence; ratio: / ORT's own p50")
    for name, values in figures.items():
        if name.endswith(" 8 x 1"):
            print(f"  {name:60s} {statistics.median(values):8.1f} requests/s (empty model)")
            continue
        ratio = statistics.median(v / o for v, o in zip(values, own, strict=True))
        label = name
        for model, variant in variants.items():
            label = label.replace(model, f"{model} ({variant})")
        print(f"  {label:60s} p50 {statistics.median(values):6.2f} ms  {ratio:5.2f} x")
    for name, values in MEANS.items():
        print(f"  {name:60s} mean {statistics.median(values):6.2f} ms (in-process)")
    print("served rows, part by part (ms, medians of per-repeat means; *_p50: p50s):")
    keys = sorted({k for rows in parts.values() for row in rows for k in row})
    for name, rows in parts.items():
        cells = [
            f"{k}={statistics.median(r[k] for r in rows if k in r):.3f}"
            for k in keys
            if any(k in r for r in rows)
        ]
        print(f"  {name}: " + ", ".join(cells))


if __name__ == "__main__":
    raise SystemExit(main())
