"""Served images/s and texts/s of each new OpenCLIP tower kind against open_clip in-process.

    .venv/bin/python -m bench.open_clip_speed [--kind all|tiny-eva ...] [--images 64]
        [--texts 256] [--repeats 3]

Builds, offline and seeded, one tiny model per tower kind (random weights, so the speed of
a shape; ``generator.fixtures``):

- ``tiny-mobileclip``: ``CustomTextCLIP``, timm FastViT image tower (MobileCLIP-S1);
- ``tiny-eva``: ``CustomTextCLIP``, timm EVA02 image tower, rotary embeddings (EVA02-B-16);
- ``tiny-coca``: ``CoCa``, attentional pooler, text ``embed_cls`` (coca_ViT-B-32;
  embeddings only);
- ``tiny-siglip``: timm ViT with ``map`` pool, last-token text pool, a Hugging Face
  T5-like tokenizer made offline, SigLIP's preprocessing (ViT-B-16-SigLIP);
- ``tiny-pe-core``: timm Perception Encoder ViT (rope, ``map`` pool) (PE-Core-B-16);
- ``tiny-xlmr``: Hugging Face XLM-R text tower (mean pooler) with an XLM-R-like
  tokenizer made offline, ViT image tower (xlm-roberta-base-ViT-B-32).

``--kind all`` (the default) builds them into one repository, serves it from one Triton of
its own (free ports, the manifest's defaults) and, kind by kind, times in rotation the same
items two ways:

- open_clip in this process, batches of 32: its own transform on each decoded image +
  ``encode_image``, its tokenizer + ``encode_text`` (what a user runs without a server);
- one gRPC client sending 32 items per request (``<name>_image`` with the encoded image
  bytes, ``<name>_text`` with the texts).

Images are 640x480 JPEGs of smooth colour fields plus noise; texts the load corpus's
varied sentences. Each served answer is compared with open_clip's (largest absolute
difference). Prints one table and writes ``bench/results/clip-speed-<time>.json``, with
the load average of the machine before and after (it is shared).
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import logger, median, save_results
from bench.machine import machine_info
from bench.manifest import served
from client import EmbeddingClient
from client.load.corpus import varied_sentences
from generator.manifest import parse_manifest

BATCH = 32
GATE = 0.9  # served / open_clip, each load
KINDS = ("tiny-mobileclip", "tiny-eva", "tiny-coca", "tiny-siglip", "tiny-pe-core", "tiny-xlmr")
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


def served_name(kind: str) -> str:
    """The manifest name of ``kind``'s model: ``tiny-pe-core`` -> ``pe_core``."""
    return kind.removeprefix("tiny-").replace("-", "_")


def create_kind(kind: str, directory: Path) -> dict[str, str]:
    """Make ``kind``'s tiny model under ``directory``; its manifest fields."""
    from generator.fixtures.tiny_clip_hf_text import create_tiny_xlmr_clip
    from generator.fixtures.tiny_clip_towers import create_tiny_tower_model

    if kind == "tiny-xlmr":
        return create_tiny_xlmr_clip(directory, seed=0)
    return create_tiny_tower_model(kind, directory, seed=0)


def _time_load(runs: dict, n: int, repeats: int, label: str) -> dict[str, Any]:
    runs["served"]()  # warm-up: sessions, connections, first shapes
    runs["library"]()
    rates: dict[str, list[float]] = {name: [] for name in runs}
    answers = {}
    for repeat in range(repeats):
        for name, run in runs.items():
            start = time.perf_counter()
            answers[name] = run()
            rates[name].append(n / (time.perf_counter() - start))
        log(
            f"{label} repeat {repeat + 1}: "
            + ", ".join(f"{k} {v[-1]:,.1f}/s" for k, v in rates.items())
        )
    gap = float(np.abs(answers["served"] - answers["library"]).max())
    ratio = median(rates["served"]) / median(rates["library"])
    log(f"{label}: served / open_clip {ratio:.2f}x (medians), max abs diff {gap:.1e}")
    return {"items": n, "rates": rates, "ratio": ratio, "max_abs_diff": gap}


def measure(args: argparse.Namespace, kinds: Sequence[str], base: Path) -> dict[str, Any]:
    """Make, build and serve the models; time each kind's loads in rotation."""
    import torch

    torch.set_num_threads(args.torch_threads)
    fields = {kind: create_kind(kind, base / kind) for kind in kinds}
    refs = {kind: _Reference(f) for kind, f in fields.items()}
    entries = [
        {"name": served_name(kind), "family": "open-clip", **f} for kind, f in fields.items()
    ]
    manifest = parse_manifest({"models": entries}, base)
    blobs, texts = _images(args.images), varied_sentences(args.texts)
    results: dict[str, Any] = {}
    with served(manifest, base, log=lambda _msg: None, timeout_s=900) as server:
        log(f"built {len(kinds)} models (parity gates passed), served")
        with EmbeddingClient(server.url(), "grpc", admin_key=server.key) as client:
            for kind in kinds:
                ref, name = refs[kind], served_name(kind)
                results[kind] = {
                    "images": _time_load(
                        {
                            "library": lambda ref=ref: library_images(ref, blobs),
                            "served": lambda name=name: np.concatenate(
                                [client.embed_images(name, c) for c in _chunks(blobs)]
                            ),
                        },
                        len(blobs),
                        args.repeats,
                        f"{kind} images",
                    ),
                    "texts": _time_load(
                        {
                            "library": lambda ref=ref: library_texts(ref, texts),
                            "served": lambda name=name: np.concatenate(
                                [client.embed_texts(f"{name}_text", c) for c in _chunks(texts)]
                            ),
                        },
                        len(texts),
                        args.repeats,
                        f"{kind} texts",
                    ),
                }
    return results


def table(results: dict[str, Any]) -> list[str]:
    """Markdown rows: kind, images served / open_clip / ratio, texts likewise, max abs."""
    rows = [
        "| kind | served images/s | open_clip images/s | ratio | served texts/s "
        "| open_clip texts/s | ratio | max abs (images / texts) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for kind, loads in results.items():
        cells = [kind]
        for what in ("images", "texts"):
            load = loads[what]
            cells += [
                f"{median(load['rates']['served']):,.1f}",
                f"{median(load['rates']['library']):,.1f}",
                f"{load['ratio']:.2f} x",
            ]
        cells.append(
            f"{loads['images']['max_abs_diff']:.1e} / {loads['texts']['max_abs_diff']:.1e}"
        )
        rows.append("| " + " | ".join(cells) + " |")
    return rows


def under_gate(results: dict[str, Any]) -> list[str]:
    """``kind load`` for each load served slower than :data:`GATE` x open_clip's rate."""
    return [
        f"{kind} {what} {loads[what]['ratio']:.2f}x"
        for kind, loads in results.items()
        for what in ("images", "texts")
        if loads[what]["ratio"] < GATE
    ]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the comparison; print and save the figures. Exit 1 if a load is under the gate."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kind", nargs="+", default=["all"], choices=["all", *KINDS])
    parser.add_argument("--images", type=int, default=64)
    parser.add_argument("--texts", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--torch-threads", type=int, default=2)
    args = parser.parse_args(argv)
    kinds = list(KINDS) if "all" in args.kind else list(dict.fromkeys(args.kind))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    load_before, t0 = os.getloadavg(), time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="clip-speed-") as tmp:
        results = measure(args, kinds, Path(tmp))
    rows, slow = table(results), under_gate(results)
    print("\n".join(rows))
    log(f"under {GATE}x: {', '.join(slow)}" if slow else f"every load at >= {GATE}x")
    data = {
        "started": started,
        "seconds": round(time.perf_counter() - t0, 1),
        "machine": machine_info(),
        "load_average_1_5_15": {"before": load_before, "after": os.getloadavg()},
        "kinds": kinds,
        "batch": BATCH,
        "images": args.images,
        "texts": args.texts,
        "repeats": args.repeats,
        "torch_threads": args.torch_threads,
        "gate": GATE,
        "under_gate": slow,
        "table": rows,
        "results": results,
    }
    log(f"saved {save_results(data, 'clip-speed')}")
    return 1 if slow else 0


if __name__ == "__main__":
    sys.exit(main())
