"""Cost per request of the output precisions (float16, int8, uint8, binary, ubinary).

    PYTHONPATH=. .venv/bin/python -m bench.studies.output_precision [--requests 200] [--rounds 5]

Builds all-MiniLM-L6-v2 with the knobs of ``models.toml`` (python-ort, fused tokenizer,
two encoder instances: what ``make serve`` runs) on a Triton of its own (free ports) and
times, side by side in one run, one gRPC client sending requests one after another, in
rotation (each round runs every mode once, in a new order), for requests of 1 and of 32
texts:

- ``float32``: ``EMBEDDING`` alone, no parameter. Through the ensemble the encoder is
  asked for every output it maps, so it computes every form (the default path);
- ``float32 + precision=float32``: the parameter tells the encoder to compute no form;
- each form with its ``precision`` parameter (what ``embed_texts(precision=...)`` sends);
- ``ubinary``, output only (no parameter: every form computed, one returned).

Prints the median latency per mode and its difference from ``float32 + precision=float32``
(the path with nothing extra), and the in-process numpy cost of computing the forms.
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient

from bench.manifest import TEXT_MODEL as MODEL
from bench.manifest import bench_manifest_data
from client.load.corpus import varied_sentences
from embed_runtime.output_precision import (
    EXTRA_PRECISIONS,
    FORMS,
    Calibration,
    precision_outputs,
)
from generator.admin import KEY_ENV
from generator.build import build_repository
from generator.manifest import parse_manifest
from generator.shared_models import startup_models
from generator.triton_local import TritonLaunch, TritonPorts, TritonProcess, free_ports

SIZES = (1, 32)


def modes() -> dict[str, tuple[str, dict]]:
    """Mode name -> (output asked for, request parameters)."""
    out = {
        "float32": ("EMBEDDING", {}),
        "float32 + precision=float32": ("EMBEDDING", {"precision": "float32"}),
    }
    for p in EXTRA_PRECISIONS:
        out[f"{p} (+ parameter)"] = (FORMS[p][0], {"precision": p})
    out["ubinary, output only"] = ("EMBEDDING_UBINARY", {})
    return out


def _request(client, texts: list[str], output: str, parameters: dict) -> float:
    data = np.array([[t.encode()] for t in texts], dtype=object)
    infer_input = grpcclient.InferInput("TEXT", list(data.shape), "BYTES")
    infer_input.set_data_from_numpy(data)
    start = time.perf_counter()
    result = client.infer(
        MODEL,
        [infer_input],
        outputs=[grpcclient.InferRequestedOutput(output)],
        parameters=parameters or None,
    )
    elapsed = time.perf_counter() - start
    if result.as_numpy(output) is None:
        raise RuntimeError(f"no {output} in the answer")
    return elapsed


def in_process_cost(calibration: Calibration, rows: int, repeats: int = 2000) -> dict[str, float]:
    """Microseconds to compute each form (and all five) of ``rows`` float32 rows."""
    embeddings = calibration.embeddings[:rows]
    out = {}
    for forms in [[p] for p in EXTRA_PRECISIONS] + [list(EXTRA_PRECISIONS)]:
        start = time.perf_counter()
        for _ in range(repeats):
            precision_outputs(embeddings, forms, calibration)
        out["all five" if len(forms) > 1 else forms[0]] = (
            (time.perf_counter() - start) / repeats * 1e6
        )
    return out


def main() -> None:
    """Build, serve, time in rotation, print medians."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200, help="per mode, size and round")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    texts = varied_sentences(400)
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory(prefix="output-precision-") as tmp:
        base = Path(tmp)
        entry = {**bench_manifest_data()["models"][0], "output_precisions": list(EXTRA_PRECISIONS)}
        manifest = parse_manifest({"models": [entry]}, base)
        build_repository(manifest, base / "repo", log=lambda _msg: None)
        calib_path = base / "repo" / f"{MODEL}_encode" / "1" / "calibration_embeddings.npy"
        calibration = Calibration.load(str(calib_path), normalize=True)
        key = secrets.token_urlsafe(24)
        ports = TritonPorts(*free_ports(3))
        launch = TritonLaunch(
            base / "repo", ports, load_models=startup_models(manifest), admin_key=key
        )
        process = TritonProcess(launch, base / "work", extra_env={KEY_ENV: key})
        process.start()
        latencies = {(m, n): [] for m in modes() for n in SIZES}
        try:
            process.wait_ready(timeout_s=240)
            client = grpcclient.InferenceServerClient(f"127.0.0.1:{ports.grpc}")
            for n in SIZES:  # warm-up
                for _ in range(20):
                    _request(client, texts[:n], "EMBEDDING", {})
            started = time.perf_counter()
            for round_no in range(args.rounds):
                order = list(modes().items())
                order = [order[i] for i in rng.permutation(len(order))]
                for name, (output, parameters) in order:
                    for n in SIZES:
                        for i in range(args.requests):
                            batch = [texts[(i * n + j) % len(texts)] for j in range(n)]
                            seconds = _request(client, batch, output, parameters)
                            latencies[(name, n)].append(seconds)
                elapsed = time.perf_counter() - started
                print(f"round {round_no + 1}/{args.rounds}: {elapsed:.0f} s", file=sys.stderr)
            client.close()
        finally:
            process.stop()
    print(
        f"{MODEL} as models.toml serves it, 1 gRPC client, requests one after another, "
        f"{args.rounds} rounds x {args.requests} requests per mode and size, "
        f"{os.cpu_count()} cores"
    )
    base_name = "float32 + precision=float32"
    for n in SIZES:
        ref = statistics.median(latencies[(base_name, n)]) * 1e3
        print(f"\nrequests of {n} text(s): median latency ms (difference from '{base_name}')")
        for name in modes():
            med = statistics.median(latencies[(name, n)]) * 1e3
            print(f"  {name:<30} {med:7.3f} ms  ({med - ref:+.3f} ms, {med / ref - 1:+.1%})")
    for rows in SIZES:
        cost = in_process_cost(calibration, rows)
        parts = ", ".join(f"{k} {v:.0f} us" for k, v in cost.items())
        print(f"\nin-process numpy, {rows} row(s) of 384: {parts}")


if __name__ == "__main__":
    main()
