"""Served images/s and texts/s of each new OpenCLIP tower kind against open_clip in-process.

    .venv/bin/python -m bench.open_clip_speed [--kind all|tiny-eva ...] [--images 64]

One tiny seeded model per tower kind, served by one Triton; open_clip in-process, in
batches of 32, against one gRPC client's call with all the items (which it sends as requests
of the ensemble's ``max_batch_size``, 32, up to ``MAX_IN_FLIGHT`` at once), in rotation.
Exits 1 when a load is under :data:`GATE`.
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from bench.common import logger, median, save_results
from bench.common import table as markdown_table
from bench.machine import machine_info
from bench.manifest import served
from bench.studies.model_kinds import rotation
from client import EmbeddingClient
from client.load.corpus import varied_sentences
from client.sending import MAX_IN_FLIGHT
from generator.families.open_clip.assets import load_open_clip
from generator.fixtures.tiny_clip_hf_text import create_tiny_xlmr_clip
from generator.fixtures.tiny_clip_towers import create_tiny_tower_model
from generator.manifest import parse_manifest

BATCH = 32
GATE = 0.9  # served / open_clip, each load
KINDS = ("tiny-mobileclip", "tiny-eva", "tiny-coca", "tiny-siglip", "tiny-pe-core", "tiny-xlmr")
log = logger("clip-speed", sys.stdout)


def _images(n: int) -> list[bytes]:
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


def _batched(encode: Callable[[list], Any], items: list) -> np.ndarray:
    """``encode`` over batches of :data:`BATCH` items, concatenated."""
    return np.concatenate([encode(items[i : i + BATCH]) for i in range(0, len(items), BATCH)])


class Reference:
    """open_clip's model, transform and tokenizer of one kind, in this process."""

    def __init__(self, fields: dict[str, str]):
        loaded = load_open_clip(fields["arch"], checkpoint=fields.get("checkpoint"))
        self.model, self.preprocess, self.tokenizer = loaded

    def images(self, blobs: list[bytes]) -> np.ndarray:
        """open_clip's transform on each decoded image + ``encode_image``."""
        import torch

        with torch.no_grad():
            pixels = torch.stack([self.preprocess(Image.open(io.BytesIO(b))) for b in blobs])
            return self.model.encode_image(pixels, normalize=True).numpy()

    def texts(self, texts: list[str]) -> np.ndarray:
        """open_clip's tokenizer + ``encode_text``."""
        import torch

        with torch.no_grad():
            return self.model.encode_text(self.tokenizer(texts), normalize=True).numpy()


def served_name(kind: str) -> str:
    """The manifest name of ``kind``'s model: ``tiny-pe-core`` -> ``pe_core``."""
    return kind.removeprefix("tiny-").replace("-", "_")


def create_kind(kind: str, directory: Path) -> dict[str, str]:
    """Make ``kind``'s tiny model under ``directory``; its manifest fields."""
    if kind == "tiny-xlmr":
        return create_tiny_xlmr_clip(directory, seed=0)
    return create_tiny_tower_model(kind, directory, seed=0)


def _time_load(runs: dict, n: int, repeats: int, label: str) -> dict[str, Any]:
    runs["served"]()  # warm-up: sessions, connections, first shapes
    runs["library"]()
    rates, answers = rotation(runs, n, repeats, label, log)
    gap = float(np.abs(answers["served"] - answers["library"]).max())
    ratio = median(rates["served"]) / median(rates["library"])
    log(f"{label}: served / open_clip {ratio:.2f}x (medians), max abs diff {gap:.1e}")
    return {"items": n, "rates": rates, "ratio": ratio, "max_abs_diff": gap}


def measure(args: argparse.Namespace, kinds: Sequence[str], base: Path) -> dict[str, Any]:
    """Make, build and serve the models; time each kind's loads in rotation."""
    import torch

    torch.set_num_threads(args.torch_threads)
    fields = {kind: create_kind(kind, base / kind) for kind in kinds}
    refs = {kind: Reference(f) for kind, f in fields.items()}
    entries = [{"name": served_name(k), "family": "open-clip", **f} for k, f in fields.items()]
    manifest = parse_manifest({"models": entries}, base)
    blobs, texts = _images(args.images), varied_sentences(args.texts)
    results: dict[str, Any] = {}
    with served(manifest, base, log=lambda _msg: None, timeout_s=900) as server:
        log(f"built {len(kinds)} models (parity gates passed), served")
        with EmbeddingClient(server.url(), "grpc", admin_key=server.key) as client:
            for kind in kinds:
                ref, name = refs[kind], served_name(kind)
                loads = (
                    ("images", blobs, ref.images, partial(client.embed_images, name)),
                    ("texts", texts, ref.texts, partial(client.embed_texts, f"{name}_text")),
                )
                results[kind] = {
                    what: _time_load({
                        "library": partial(_batched, library, items),
                        "served": partial(serve, items),
                    }, len(items), args.repeats, f"{kind} {what}")
                    for what, items, library, serve in loads
                }
    return results


def table(results: dict[str, Any]) -> list[str]:
    """Markdown rows: kind, images served / open_clip / ratio, texts likewise, max abs."""
    rows = []
    for kind, loads in results.items():
        cells = [kind]
        for what in ("images", "texts"):
            load = loads[what]
            served, library = (median(load["rates"][run]) for run in ("served", "library"))
            cells += [f"{served:,.1f}", f"{library:,.1f}", f"{load['ratio']:.2f} x"]
        gaps = (loads["images"]["max_abs_diff"], loads["texts"]["max_abs_diff"])
        rows.append([*cells, f"{gaps[0]:.1e} / {gaps[1]:.1e}"])
    header = ["kind", "served images/s", "open_clip images/s", "ratio", "served texts/s",
              "open_clip texts/s", "ratio", "max abs (images / texts)"]
    return markdown_table(header, rows).splitlines()


def under_gate(results: dict[str, Any]) -> list[str]:
    """``kind load`` for each load served slower than :data:`GATE` x open_clip's rate."""
    return [f"{kind} {what} {loads[what]['ratio']:.2f}x" for kind, loads in results.items()
            for what in ("images", "texts") if loads[what]["ratio"] < GATE]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the comparison; print and save the figures. Exit 1 if a load is under the gate."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kind", nargs="+", default=["all"], choices=["all", *KINDS])
    parser.add_argument("--images", type=int, default=64)
    parser.add_argument("--texts", type=int, default=1024)
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
        "started": started, "seconds": round(time.perf_counter() - t0, 1),
        "machine": machine_info(),
        "load_average_1_5_15": {"before": load_before, "after": os.getloadavg()},
        "kinds": kinds, "batch": BATCH, "images": args.images, "texts": args.texts,
        "repeats": args.repeats, "torch_threads": args.torch_threads, "gate": GATE,
        "client_in_flight": MAX_IN_FLIGHT,
        "under_gate": slow, "table": rows, "results": results,
    }
    log(f"saved {save_results(data, 'clip-speed')}")
    return 1 if slow else 0


if __name__ == "__main__":
    sys.exit(main())
