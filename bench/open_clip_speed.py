"""Served images/s and texts/s of a new OpenCLIP tower kind against open_clip in-process.

    .venv/bin/python -m bench.open_clip_speed [--kind tiny-mobileclip] [--images 64]
        [--texts 256] [--repeats 3]

Builds, offline and seeded, one ``CustomTextCLIP`` (default: the MobileCLIP-shaped tiny
model of ``generator.fixtures.tiny_clip_towers``, FastViT image tower; random weights, so
the speed of a shape), serves it from a Triton of its own (free ports, the manifest's
defaults) and times, in rotation, the same items two ways:

- open_clip in this process, batches of 32: its own transform on each decoded image +
  ``encode_image``, its tokenizer + ``encode_text`` (what a user runs without a server);
- one gRPC client sending 32 items per request (``<name>_image`` with the encoded image
  bytes, ``<name>_text`` with the texts).

Images are 640x480 JPEGs of smooth colour fields plus noise; texts the load corpus's
varied sentences. Each served answer is compared with open_clip's (largest absolute
difference). Prints the rates and writes ``bench/results/clip-speed-<time>.json``.
"""

from __future__ import annotations

import argparse
import io
import os
import secrets
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import logger, median, save_results
from bench.machine import machine_info
from client import EmbeddingClient
from client.load.corpus import varied_sentences
from generator.admin import KEY_ENV
from generator.build import build_repository
from generator.manifest import parse_manifest
from generator.shared_models import startup_models
from generator.triton_local import TritonLaunch, TritonPorts, TritonProcess, free_ports

BATCH = 32
log = logger("clip-speed", sys.stdout)


def _images(n: int) -> list[bytes]:
    from PIL import Image

    rng = np.random.default_rng(0)
    grid = np.mgrid[0:480, 0:640].astype(np.float32)
    blobs = []
    for i in range(n):
        base = np.stack([grid[0] * (1 + i % 3), grid[1] * 2, grid[0] + grid[1] * i], -1) % 256
        noisy = (base * 0.7 + rng.integers(0, 70, (480, 640, 3))).astype(np.uint8)
        buf = io.BytesIO()
        Image.fromarray(noisy).save(buf, "JPEG", quality=90)
        blobs.append(buf.getvalue())
    return blobs


def _chunks(items: list, size: int = BATCH):
    return [items[i : i + size] for i in range(0, len(items), size)]


def library_images(ref, blobs: list[bytes]) -> np.ndarray:
    """open_clip's transform + encode_image, batches of 32 (decoding included)."""
    import torch
    from PIL import Image

    out = []
    with torch.no_grad():
        for chunk in _chunks(blobs):
            pixels = torch.stack([ref.preprocess(Image.open(io.BytesIO(b))) for b in chunk])
            out.append(ref.model.encode_image(pixels, normalize=True).numpy())
    return np.concatenate(out)


def library_texts(ref, texts: list[str]) -> np.ndarray:
    """open_clip's tokenizer + encode_text, batches of 32."""
    import torch

    out = []
    with torch.no_grad():
        for chunk in _chunks(texts):
            out.append(ref.model.encode_text(ref.tokenizer(chunk), normalize=True).numpy())
    return np.concatenate(out)


class _Reference:
    def __init__(self, fields: dict[str, str]):
        from generator.families.open_clip.assets import load_open_clip

        self.model, self.preprocess, self.tokenizer = load_open_clip(
            fields["arch"], checkpoint=fields.get("checkpoint")
        )


def measure(args: argparse.Namespace, base: Path) -> dict[str, Any]:
    """Make, build and serve the model; time the loads in rotation."""
    import torch

    from generator.fixtures.tiny_clip_towers import create_tiny_tower_model

    torch.set_num_threads(args.torch_threads)
    fields = create_tiny_tower_model(args.kind, base / "model", seed=0)
    ref = _Reference(fields)
    entry = {"name": "clip", "family": "open-clip", **fields}
    manifest = parse_manifest({"models": [entry]}, base)
    build_repository(manifest, base / "repo", log=lambda _msg: None)
    log("built the repository (parity gate passed)")
    blobs, texts = _images(args.images), varied_sentences(args.texts)
    key = secrets.token_urlsafe(24)
    ports = TritonPorts(*free_ports(3))
    launch = TritonLaunch(base / "repo", ports, load_models=startup_models(manifest), admin_key=key)
    process = TritonProcess(launch, base / "work", extra_env={KEY_ENV: key})
    process.start()
    results: dict[str, Any] = {}
    try:
        process.wait_ready(timeout_s=600)
        with EmbeddingClient(f"127.0.0.1:{ports.grpc}", "grpc", admin_key=key) as client:
            loads = {
                "images": {
                    "library": lambda: library_images(ref, blobs),
                    "served": lambda: np.concatenate(
                        [client.embed_images("clip", c) for c in _chunks(blobs)]
                    ),
                },
                "texts": {
                    "library": lambda: library_texts(ref, texts),
                    "served": lambda: np.concatenate(
                        [client.embed_texts("clip_text", c) for c in _chunks(texts)]
                    ),
                },
            }
            for what, runs in loads.items():
                n = len(blobs) if what == "images" else len(texts)
                runs["served"]()  # warm-up: sessions, connections, first shapes
                runs["library"]()
                rates: dict[str, list[float]] = {name: [] for name in runs}
                answers = {}
                for repeat in range(args.repeats):
                    for name, run in runs.items():
                        start = time.perf_counter()
                        answers[name] = run()
                        rates[name].append(n / (time.perf_counter() - start))
                    log(
                        f"{what} repeat {repeat + 1}: "
                        + ", ".join(f"{k} {v[-1]:,.1f}/s" for k, v in rates.items())
                    )
                gap = float(np.abs(answers["served"] - answers["library"]).max())
                ratio = median(rates["served"]) / median(rates["library"])
                results[what] = {"items": n, "rates": rates, "ratio": ratio, "max_abs_diff": gap}
                log(f"{what}: served / open_clip {ratio:.2f}x (medians), max abs diff {gap:.1e}")
    finally:
        process.stop()
    return results


def main(argv: Sequence[str] | None = None) -> int:
    """Run the comparison; print and save the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kind", default="tiny-mobileclip")
    parser.add_argument("--images", type=int, default=64)
    parser.add_argument("--texts", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--torch-threads", type=int, default=2)
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    with tempfile.TemporaryDirectory(prefix="clip-speed-") as tmp:
        results = measure(args, Path(tmp))
    data = {
        "started": started,
        "machine": machine_info(),
        "kind": args.kind,
        "batch": BATCH,
        "torch_threads": args.torch_threads,
        "results": results,
    }
    log(f"saved {save_results(data, 'clip-speed')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
