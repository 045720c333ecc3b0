"""The 1 x 1 latency floor of this server on this host, beside the served model.

    python -m bench.studies.floor [--repeats 5]

Builds the bench repository with the shipped text settings and adds a copy of the text
ensemble whose encoder is an empty Python model (``bench/studies/floor_model``: same config,
reads ``TEXT``, returns zeros). In rotation, each repeat measures one client sending one
sentence at a time to both ensembles (the load generator and load of ``make bench``) and
ONNX Runtime's batch-1 p50 in-process on the same sentences (the latency target's
reference), and the encoder stub's own code in-process (``TextEncoder.read`` + ``embed``
on one sentence at a time: checks, tokenizing, the run, the response rows). The empty
model's p50 is what Triton, the ensemble step, the Python backend's round trip, gRPC and
the client cost on this host before any work: a served p50 can not come closer to ONNX
Runtime's than that. Triton's compute time of each encoder (its ``execute`` as the
server sees it) is recorded beside. Prints medians; ``--json`` saves every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import shutil
import statistics
import time
from contextlib import ExitStack
from pathlib import Path

from bench.ceiling import config_parameters, make_session, text_ceiling
from bench.common import logger
from bench.loads import text_loads
from bench.manifest import BUILD, TEXT_MODEL, bench_manifest
from client.load.loadgen import run_triton_load
from client.load.workload import text_pool, text_requests
from generator.admin import KEY_ENV
from generator.build import build_repository
from generator.triton_local import TritonLaunch, TritonPorts, TritonProcess, free_ports

FLOOR = f"{TEXT_MODEL}-floor"
FLOOR_MODEL = Path(__file__).with_name("floor_model") / "model.py"

log = logger("bench")


def add_floor(repo: Path) -> None:
    """``<model>-floor``: the text ensemble with the empty model in its encoder's place."""
    encoder, floor_encoder = repo / f"{TEXT_MODEL}_encode", repo / f"{FLOOR}_encode"
    shutil.rmtree(floor_encoder, ignore_errors=True)
    (floor_encoder / "1").mkdir(parents=True)
    shutil.copy(FLOOR_MODEL, floor_encoder / "1" / "model.py")
    config = (encoder / "config.pbtxt").read_text()
    (floor_encoder / "config.pbtxt").write_text(
        re.sub(r'^name: ".*"', f'name: "{FLOOR}_encode"', config, count=1, flags=re.M)
    )
    ensemble = (repo / TEXT_MODEL / "config.pbtxt").read_text()
    if "_tokenize" in ensemble:
        raise SystemExit("bench.studies.floor needs the shipped fused_tokenize ensemble (one step)")
    ensemble = ensemble.replace(f'"{TEXT_MODEL}_encode"', f'"{FLOOR}_encode"')
    ensemble = re.sub(r'^name: ".*"', f'name: "{FLOOR}"', ensemble, count=1, flags=re.M)
    (repo / FLOOR / "1").mkdir(parents=True, exist_ok=True)
    (repo / FLOOR / "config.pbtxt").write_text(ensemble)


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
    return statistics.median(times) * 1e3


def main(argv=None) -> int:
    """Measure, print and optionally save; returns 0."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--protocol", choices=("grpc", "http"), default="grpc")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    repo = BUILD / "floor-repo"
    build_repository(bench_manifest("cpu", False, {}), repo, log=log)
    add_floor(repo)
    pool = text_pool()
    spec = next(load.spec for load in text_loads(False) if load.key == "1 x 1")
    requests = text_requests(pool, 1, spec.warmup_requests + spec.requests_per_client)
    figures: dict[str, list[float]] = {"ort_batch1": [], "stub_code": [], TEXT_MODEL: [], FLOOR: []}
    infer: dict[str, list[float]] = {TEXT_MODEL: [], FLOOR: []}
    with ExitStack() as stack:
        ports = TritonPorts(*free_ports(3))
        key = os.environ.setdefault(KEY_ENV, secrets.token_urlsafe(32))
        launch = TritonLaunch(repo, ports, load_models=(TEXT_MODEL, FLOOR), admin_key=key)
        process = TritonProcess(launch, BUILD / "floor-work").start()
        stack.callback(process.stop)
        process.wait_ready(timeout_s=300)
        url = f"127.0.0.1:{ports.grpc if args.protocol == 'grpc' else ports.http}"
        order = list(figures)
        for repeat in range(args.repeats):
            shift = repeat % len(order)
            for name in order[shift:] + order[:shift]:
                if name == "ort_batch1":
                    session = make_session(repo / f"{TEXT_MODEL}_encode" / "1" / "model.onnx")
                    p50 = text_ceiling(repo, TEXT_MODEL, pool, "cpu", 0, session).batch1_p50_ms
                    del session
                elif name == "stub_code":
                    p50 = stub_code_p50(repo, pool[:250])
                else:
                    result = run_triton_load(
                        url, args.protocol, name, "TEXT", requests, spec, "1 x 1"
                    )
                    p50 = result.median_ms
                    stats = {m.name: m for m in result.server or []}
                    infer[name].append(stats[f"{name}_encode"].avg_compute_infer_ms)
                figures[name].append(p50)
                log(f"repeat {repeat + 1} {name:28s} p50 {p50:6.2f} ms")
    median = {name: statistics.median(values) for name, values in figures.items()}
    over = {
        name: [v - o for v, o in zip(values, figures["ort_batch1"], strict=True)]
        for name, values in figures.items()
    }
    print(f"medians of {args.repeats} repeats ({args.protocol}, 1 client x 1 sentence)")
    for name in order:
        line = (
            f"  {name:28s} p50 {median[name]:6.2f} ms   over ORT batch-1: "
            f"{statistics.median(over[name]):+6.2f} ms"
        )
        if infer.get(name):
            line += f"   encoder compute (Triton, mean) {statistics.median(infer[name]):6.2f} ms"
        print(line)
    if args.json:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        record = {
            "run": stamp,
            "protocol": args.protocol,
            "p50_ms": figures,
            "over_ms": over,
            "encoder_compute_infer_ms": infer,
        }
        args.json.write_text(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
