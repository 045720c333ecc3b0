"""Full-size OpenCLIP ViT-B-32 (random init): export and served parity vs open_clip.

The module builds its own repository from a random-init ``ViT-B-32`` checkpoint
(``open_clip.create_model("ViT-B-32")``, no pretrained weights, saved with
``torch.save(state_dict)``) and starts its own server. The build exports and validates
both towers; the tests then hold the exported graphs and the served ensembles to the
figures of docs/parity.md against open_clip in PyTorch, loaded the way users load a checkpoint.
The whole module takes about 35 s on an idle 2-core machine (build 15 s, start 5 s).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import numpy as np
import pytest

from client.load.corpus import varied_sentences
from generator.admin import KEY_ENV
from generator.build import build_repository
from generator.manifest import parse_manifest
from generator.shared_models import startup_models
from generator.triton_local import TritonLaunch, TritonPorts, TritonProcess, free_ports
from tests.integration.clip_fixture import ClipReference, sample_images
from tests.integration.conftest import ADMIN_KEY, Server

pytestmark = [pytest.mark.integration, pytest.mark.slow]

FULL_MODEL = "clip-vit-b-32-random"
IMAGES = sample_images()
NAMES = sorted(IMAGES)
TEXTS = varied_sentences(16)
# Gates: about 30 x the figures measured on the 2-core CI machine, which are the same
# for the exported graphs and the served ensembles (HTTP and gRPC): text max abs 1.7e-7,
# 1-cos 5.6e-13; images (12 kinds + 2 of noise) max abs 1.5e-7, 1-cos 6.3e-13.
EXPORT_MAX_ABS = 6e-6
EXPORT_MAX_COS_GAP = 2e-11
SERVED_MAX_ABS = 5e-6
SERVED_MAX_COS_GAP = 2e-11


@dataclass(frozen=True)
class FullSize:
    """The running server, and the inputs and answers of the same checkpoint in open_clip."""

    server: Server
    input_ids: np.ndarray
    pixel_values: np.ndarray
    text: np.ndarray
    image: np.ndarray


def _reference(checkpoint: str) -> tuple[np.ndarray, ...]:
    """Token ids, pixels (the sample images, then 2 of noise) and open_clip's embeddings."""
    import torch

    reference = ClipReference("ViT-B-32", checkpoint)
    noise = torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    pixels = torch.cat([reference.pixels([IMAGES[name] for name in NAMES]), noise])
    ids = reference.tokenizer(TEXTS).numpy()
    return ids, pixels.numpy(), reference.text(TEXTS), reference.encode_pixels(pixels)


@pytest.fixture(scope="module")
def full_size(tmp_path_factory) -> FullSize:
    """Random-init ViT-B-32 checkpoint -> repository (export + validation) -> Triton."""
    import open_clip
    import torch

    start = time.monotonic()
    base = tmp_path_factory.mktemp("clip-full")
    torch.manual_seed(0)
    checkpoint = base / "vit-b-32-random.pt"
    torch.save(open_clip.create_model("ViT-B-32").state_dict(), checkpoint)
    entry = {
        "name": FULL_MODEL,
        "family": "open-clip",
        "arch": "ViT-B-32",
        "checkpoint": str(checkpoint),
        "max_batch_size": 8,
    }
    manifest = parse_manifest({"models": [entry]}, base)
    repo = base / "model_repository"
    build_repository(manifest, repo, log=lambda _msg: None)
    built = time.monotonic()
    ports = TritonPorts(*free_ports(3))
    launch = TritonLaunch(repo, ports, load_models=startup_models(manifest), admin_key=ADMIN_KEY)
    process = TritonProcess(launch, base / "work", extra_env={KEY_ENV: ADMIN_KEY})
    process.start()
    try:
        reference = _reference(str(checkpoint))
        process.wait_ready(timeout_s=float(os.environ.get("TRITON_START_TIMEOUT", 240)))
        ready = time.monotonic() - built
        print(f"\nViT-B-32: checkpoint + build {built - start:.0f} s, then ready {ready:.0f} s")
        yield FullSize(Server(ports, manifest, repo, process), *reference)
    finally:
        process.stop()


def _gaps(got: np.ndarray, want: np.ndarray) -> tuple[float, float]:
    """(1 - the minimum row cosine, the maximum absolute difference), in float64."""
    got, want = np.atleast_2d(got).astype(np.float64), np.atleast_2d(want).astype(np.float64)
    cos = np.sum(got * want, axis=1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    return float(1.0 - cos.min()), float(np.abs(got - want).max())


def test_full_size_towers_export_within_the_parity_figure(full_size):
    """The graphs the build exported vs the PyTorch towers (docs/parity.md, ONNX export row:
    max abs <= 7.2e-7)."""
    import onnxruntime as ort

    for step, name, inputs, want in (
        ("encode_text", "input_ids", full_size.input_ids, full_size.text),
        ("encode_image", "pixel_values", full_size.pixel_values, full_size.image),
    ):
        path = full_size.server.repo / f"{FULL_MODEL}_{step}" / "1" / "model.onnx"
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        (got,) = session.run(["EMBEDDING"], {name: inputs})
        cos_gap, max_abs = _gaps(got, want)
        print(f"\nViT-B-32 {step} export: 1-cos {cos_gap:.1e}, max abs {max_abs:.1e}")
        assert got.shape == (len(inputs), 512)
        assert max_abs <= EXPORT_MAX_ABS, step
        assert cos_gap <= EXPORT_MAX_COS_GAP, step


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_full_size_served_text_matches_open_clip(full_size, protocol):
    with full_size.server.client(protocol) as client:
        got = client.embed_texts(f"{FULL_MODEL}_text", TEXTS)
    cos_gap, max_abs = _gaps(got, full_size.text)
    print(f"\nViT-B-32 served text {protocol}: 1-cos {cos_gap:.1e}, max abs {max_abs:.1e}")
    assert got.shape == (len(TEXTS), 512)
    assert max_abs <= SERVED_MAX_ABS
    assert cos_gap <= SERVED_MAX_COS_GAP


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_full_size_served_images_match_open_clip(full_size, protocol):
    with full_size.server.client(protocol) as client:
        got = client.embed_images(FULL_MODEL, [IMAGES[name] for name in NAMES])
    assert got.shape == (len(NAMES), 512)
    for row, name in enumerate(NAMES):
        cos_gap, max_abs = _gaps(got[row], full_size.image[row])
        print(f"\nViT-B-32 served {name} {protocol}: 1-cos {cos_gap:.1e}, max abs {max_abs:.1e}")
        assert max_abs <= SERVED_MAX_ABS, name
        assert cos_gap <= SERVED_MAX_COS_GAP, name
