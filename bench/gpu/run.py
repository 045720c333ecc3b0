"""The GPU benchmark: ``python -m bench.gpu`` on a CUDA host (onnxruntime-gpu installed).

Random-init models with ``deploy/models.toml``'s GPU knobs: placement and parity checks, a
perf_analyzer sweep of every ensemble while sampling the GPU, then the same graphs in-process
(:mod:`bench.gpu.rates`). ``--report FILE...`` renders saved results files.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import socket
import subprocess
import sys
import time
import tomllib
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient

from bench.common import logger
from bench.gpu import images, rates, report
from bench.machine import GpuSampler, gpu_facts, nvidia_smi
from bench.manifest import BUILD, ROOT, parse_overrides, served
from client.load.perf_data import write_perf_data
from client.load.workload import generated_images, text_pool
from generator.fixtures.random_text import create_random_text_model
from generator.manifest import parse_manifest
from generator.triton_local import free_ports

TEXT_MODEL = "e5-small-random"
CLIP_MODEL = "clip-vit-b-32"
# The stubs start their interpreter isolated (PYTHONPATH ignored); a .pth file in the
# interpreter's site-packages (deploy/gpu/run_bench_offline.sh) reads this variable.
STUB_PATH_ENV = "EMBED_STUB_SYSPATH"
PARITY_MIN_COSINE = {"fp16": 0.999, "fp32": 0.99999}
PERF_MS = {  # result key: perf_analyzer's CSV column (µs)
    "p50_ms": "p50 latency", "p99_ms": "p99 latency", "server_queue_ms": "Server Queue",
    "server_compute_ms": "Server Compute Infer",
}
GPU_MANIFEST = ROOT / "deploy" / "models.toml"
SOURCE_KEYS = ("name", "family", "source", "arch", "pretrained", "checkpoint")
log = logger("gpu")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(prog="python -m bench.gpu", description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=BUILD / "gpu-results")
    parser.add_argument("--tokenizer", type=Path, help="BERT tokenizer folder (default MiniLM)")
    parser.add_argument("--text-shape", default="e5-small")
    parser.add_argument("--precision", choices=["fp16", "fp32"], default="fp16")
    parser.add_argument("--perf-analyzer", default="perf_analyzer")
    parser.add_argument("--measurement-ms", type=int, default=3000)
    parser.add_argument("--text-concurrency", default="1 16 128 512 1024")
    parser.add_argument("--image-concurrency", default="1 32 128 256")
    parser.add_argument("--models", choices=["all", "text", "clip"], default="all",
                        help="which ensembles to drive (all are built and served either way)")
    parser.add_argument("--json-out", type=Path, help="also copy the results file here")
    parser.add_argument("--set", action="append", default=[], metavar="MODEL.KEY=VALUE",
                        help="override a manifest knob, e.g. text.max_queue_delay_us=500")
    parser.add_argument("--skip-images", action="store_true")
    parser.add_argument("--stub-pythonpath",
                        help="folders put first on the stubs' sys.path (via $EMBED_STUB_SYSPATH)")
    parser.add_argument("--report", type=Path, nargs="+",
                        help="render saved results files into docs/")
    parser.add_argument("--probe", action="store_true",
                        help="only decode one photo on the GPU and compare it with Pillow")
    return parser.parse_args(argv)


def manifest_data(text_dir: Path, precision: str, overrides: list[str]) -> dict:
    """``deploy/models.toml``'s knobs on the random-init models, then ``overrides``."""
    shipped = tomllib.loads(GPU_MANIFEST.read_text())
    families = {e["family"]: e for e in shipped["models"]}

    def knobs(family: str) -> dict:
        return {k: v for k, v in families[family].items() if k not in SOURCE_KEYS}

    text = {**knobs("sentence-transformers"), "name": TEXT_MODEL,
            "family": "sentence-transformers", "source": str(text_dir)}
    clip = {**knobs("open-clip"), "name": CLIP_MODEL, "family": "open-clip", "arch": "ViT-B-32"}
    for entry in (text, clip):
        entry.update(device="gpu", precision=precision)
    for pair in overrides:
        target, _, setting = pair.partition(".")
        {"text": text, "clip": clip}[target].update(parse_overrides([setting]))
    fetch = dict(shipped.get("fetch_image", {}))
    fetch["allow_hosts"] = ["127.0.0.1"]
    return {"models": [text, clip], "fetch_image": fetch}


def serve_folder(folder: Path, port: int) -> subprocess.Popen:
    """``python -m http.server`` for the URL loads, in a process of its own (no GIL shared)."""
    # http.server's own CLI keeps a listen backlog of 5: under hundreds of concurrent
    # fetches the kernel drops connections and the fetches time out on connect.
    code = (
        "import functools, http.server as h, sys\n"
        "h.ThreadingHTTPServer.request_queue_size = 1024\n"
        "handler = functools.partial(h.SimpleHTTPRequestHandler, directory=sys.argv[2])\n"
        "h.ThreadingHTTPServer(('127.0.0.1', int(sys.argv[1])), handler).serve_forever()\n"
    )
    server = subprocess.Popen([sys.executable, "-c", code, str(port), str(folder)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return server
        except OSError:
            time.sleep(0.1)
    server.kill()
    raise RuntimeError(f"the image server on port {port} did not start")


def text_parity(grpc_url: str, text_dir: Path, sentences: list[str], precision: str) -> dict:
    """Served embeddings against ``SentenceTransformer.encode`` on the same GPU (fp32)."""
    from sentence_transformers import SentenceTransformer

    client = grpcclient.InferenceServerClient(grpc_url)
    served = [images.embed_one(client, TEXT_MODEL, "TEXT", s.encode())[0] for s in sentences]
    model = SentenceTransformer(str(text_dir), device="cuda")
    reference = model.encode(sentences, normalize_embeddings=True, batch_size=64)
    served = np.asarray(served, dtype=np.float64)
    cosine = images.cosine_rows(served, reference)
    gate = PARITY_MIN_COSINE[precision]
    return {
        "sentences": len(sentences), "min_cosine": float(cosine.min()),
        "max_abs": float(np.abs(served - reference).max()), "gate_min_cosine": gate,
        "passed": bool(cosine.min() >= gate),
    }


def perf_run(args, url: str, key: str, model: str, data: Path, concurrency: int, out: Path):
    """One perf_analyzer measurement at ``concurrency``; its CSV row as a dict."""
    csv_path = out / f"pa-{model}-{data.stem}-c{concurrency}.csv"
    cmd = [
        args.perf_analyzer, "-m", model, "-i", "grpc", "-u", url,
        "--input-data", str(data), "--concurrency-range", f"{concurrency}:{concurrency}",
        "--measurement-interval", str(args.measurement_ms), "-s", "15", "-r", "8",
        "-f", str(csv_path), "-H", f"triton-grpc-protocol-x-admin-key:{key}",
        # Asynchronous calls: a few client threads keep the requests in flight, where
        # synchronous ones take a thread each and the CPU the server needs.
        "--async",
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    (out / f"pa-{model}-{data.stem}-c{concurrency}.log").write_text(done.stdout + done.stderr)
    if done.returncode != 0 or not csv_path.is_file():
        return {"error": (done.stdout + done.stderr)[-600:]}
    with csv_path.open() as handle:
        row = next(csv.DictReader(handle))
    return {
        "perf_analyzer_tail": done.stdout[-1500:], "qps": float(row["Inferences/Second"]),
        **{key: float(row[column]) / 1000.0 for key, column in PERF_MS.items()},  # µs -> ms
    }


def sweep(args, url, key, model, data, levels, sampler) -> list[dict]:
    """perf_analyzer at each concurrency level, with the GPU's utilisation of each window."""
    rows = []
    for level in levels:
        start = time.monotonic()
        row = perf_run(args, url, key, model, data, level, args.out)
        row.update(model=model, concurrency=level, data=data.name,
                   **sampler.window(start, time.monotonic()))
        rows.append(row)
        shown = f"{row['qps']:9.1f} QPS p50 {row['p50_ms']:7.2f} ms" if "qps" in row else "FAILED"
        log(f"  {model:28s} c={level:4d} {shown}  GPU {row['gpu_util_mean']}%")
    return rows


def save(results: dict, args: argparse.Namespace, started: str) -> Path:
    """Write (or rewrite) the results file, and its copy under ``--json-out``."""
    text = json.dumps(results, indent=1) + "\n"
    path = args.out / f"gpu-{args.models}-{started}.json"
    path.write_text(text)
    if args.json_out:
        args.json_out.mkdir(parents=True, exist_ok=True)
        (args.json_out / path.name).write_text(text)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    """Run the GPU benchmark; returns the exit code (1 when a check failed)."""
    args = parse_args(argv)
    if args.report:
        from bench import page

        print(report.render_gpu_section([json.loads(path.read_text()) for path in args.report]))
        page.main([])  # the page's GPU section: the newest gpu-all run file in bench/results
        return 0
    if args.probe:
        print(json.dumps(images.probe()))
        return 0
    started = time.strftime("%Y-%m-%dT%H%M%SZ", time.gmtime())
    with_text = args.models in ("all", "text")
    with_clip = args.models in ("all", "clip") and not args.skip_images
    args.out.mkdir(parents=True, exist_ok=True)
    settings = {k: str(v) for k, v in vars(args).items()}
    meta = {"started": started, "args": settings, "machine": gpu_facts()}
    results: dict = {"meta": meta}
    log(f"machine: {meta['machine']}")
    if "CUDAExecutionProvider" not in meta["machine"]["ort_providers"]:
        raise SystemExit("this onnxruntime has no CUDAExecutionProvider: install onnxruntime-gpu")
    text_dir = BUILD / "gpu" / f"{args.text_shape}-random"
    create_random_text_model(text_dir, args.text_shape, args.tokenizer)
    data = manifest_data(text_dir, args.precision, args.set)
    if args.skip_images:
        data["models"] = data["models"][:1]
    meta["manifest"] = data
    manifest = parse_manifest(data, ROOT, "gpu bench manifest")
    perf_dir = args.out / "perf-data"
    photos = generated_images()
    sentences = text_pool(2048)
    failures: list[str] = []
    with ExitStack() as stack:
        sampler = GpuSampler()
        stack.callback(sampler.stop)
        image_port = free_ports(1)[0]
        image_url = f"http://127.0.0.1:{image_port}"
        write_perf_data(perf_dir, "clip", image_base_url=image_url)
        stack.callback(serve_folder(perf_dir / "images", image_port).kill)
        images.write_jpeg_only(perf_dir, image_url)
        if args.stub_pythonpath:  # the server inherits it; this process has imported numpy
            os.environ[STUB_PATH_ENV] = args.stub_pythonpath
        t0 = time.monotonic()
        server = stack.enter_context(served(manifest, "gpu", log=log, timeout_s=600))
        repo, key = server.repo, server.key
        meta["build_s"] = round(time.monotonic() - t0 - server.ready_s, 1)
        meta["start_to_ready_s"] = round(server.ready_s, 1)
        encoders = sorted(p.name for p in repo.iterdir() if p.is_dir() and "_encode" in p.name)
        held = {m: h["mib"] for m, h in images.stubs_gpu_memory(nvidia_smi, encoders).items()}
        results["placement"] = {"encoder_gpu_mib": held, "encoders": encoders}
        log(f"encoder stubs holding GPU memory (MiB): {held}")
        if sorted(held) != sorted(encoders):
            failures.append(f"encoders without GPU memory: {sorted(set(encoders) - set(held))}")
        url = server.url()
        results["parity"] = text_parity(url, text_dir, sentences[:64], args.precision)
        log(f"parity vs sentence-transformers (CUDA): {results['parity']}")
        if not results["parity"]["passed"]:
            failures.append("text parity below its gate")
        if images.clip_gpu_decode(manifest):
            results["image_gpu"] = images.served_image_checks(url, repo, photos, nvidia_smi)
            log(f"GPU image decode, served: {results['image_gpu']}")
        text_levels = [int(c) for c in args.text_concurrency.split()]
        image_levels = [int(c) for c in args.image_concurrency.split()]
        plan = [(TEXT_MODEL, "text.json", text_levels)] if with_text else []
        if with_clip:
            plan += [
                (f"{CLIP_MODEL}_text", "text.json", text_levels),
                (f"{CLIP_MODEL}_image", "image.json", image_levels),
                (f"{CLIP_MODEL}_image_url", "image_url.json", image_levels),
                # The same loads with the JPEGs alone (with image_decode "gpu", all on the GPU).
                (f"{CLIP_MODEL}_image", "image_jpeg.json", image_levels),
                (f"{CLIP_MODEL}_image_url", "image_url_jpeg.json", image_levels),
            ]
        results["runs"] = runs = []
        for model, data_file, levels in plan:
            runs += sweep(args, url, key, model, perf_dir / data_file, levels, sampler)
            save(results, args, started)
        results["server_log_tail"] = server.process.log_tail(40)
    ceilings = results["ceilings"] = {}
    if with_text:
        ceilings["text_ort"] = rates.text_ceiling_gpu(repo, TEXT_MODEL, sentences)
        ceilings["text_torch_fp16"] = rates.torch_text_rate(text_dir, sentences)
    if with_clip:
        ceilings["clip_text_ort"] = rates.clip_text_ceiling(repo, CLIP_MODEL)
        ceilings["image_tower_ort"] = rates.image_tower_ceiling(repo, CLIP_MODEL)
        ceilings["image_preprocess_cpu"] = rates.preprocess_ceiling(repo, CLIP_MODEL, photos)
        if images.clip_gpu_decode(manifest):
            ceilings.update(images.in_process_image_gpu(repo, photos))
    log(f"ceilings: {ceilings}")
    results["failures"] = failures
    log(f"results: {save(results, args, started)}")
    for model, target in report.TARGETS.items():
        best = max((r.get("qps", 0.0) for r in runs if r["model"] == model), default=0.0)
        print(f"{model:30s} best {best:9.1f} QPS  target {target:6d}  "
              f"{'met' if best >= target else 'NOT met'}")
    for failure in failures:
        print(f"FAILED: {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
