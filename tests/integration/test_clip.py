"""OpenCLIP through the real server: all three ensembles against open_clip in PyTorch."""

from __future__ import annotations

import base64
import io
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.http as httpclient
from PIL import Image
from tritonclient.utils import InferenceServerException

from client import EmbeddingClientError
from client.corpus import varied_sentences
from tests.integration.clip_fixture import CLIP_MODEL, decompression_bomb, sample_images
from tests.integration.image_server import ImageServer, closed_port

pytestmark = pytest.mark.integration
IMAGES = sample_images()


@pytest.fixture(scope="session")
def clip_reference(server):
    import torch

    from generator.families.open_clip_assets import load_open_clip

    entry = server.manifest.get(CLIP_MODEL)
    model, preprocess, tokenizer = load_open_clip(entry.arch, checkpoint=entry.checkpoint)

    def text(texts):
        with torch.no_grad():
            return model.encode_text(tokenizer(texts), normalize=True).numpy()

    def image(data: bytes):
        with torch.no_grad():
            pixels = preprocess(Image.open(io.BytesIO(data))).unsqueeze(0)
            return model.encode_image(pixels, normalize=True).numpy()[0]

    return text, image


@pytest.fixture(scope="session")
def image_server():
    with ImageServer({**IMAGES, "bomb.png": decompression_bomb()}, hang_s=6.0) as srv:
        yield srv


def _min_cos(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.atleast_2d(a), np.atleast_2d(b)
    return float(
        np.min(np.sum(a * b, axis=1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1))
    )


def test_text_ensemble_matches_open_clip(client, clip_reference):
    texts = varied_sentences(64)
    got = client.embed_texts(f"{CLIP_MODEL}_text", texts)
    want = clip_reference[0](texts)
    print(f"\nclip text {client.protocol}: min cos {_min_cos(got, want):.7f}")
    assert _min_cos(got, want) >= 0.9999
    assert np.abs(got - want).max() <= 1e-4


@pytest.mark.parametrize("name", sorted(IMAGES))
def test_image_ensemble_matches_open_clip(client, clip_reference, name):
    got = client.embed_images(CLIP_MODEL, [IMAGES[name]])[0]
    want = clip_reference[1](IMAGES[name])
    assert _min_cos(got, want) >= 0.9999, name


def test_url_and_bytes_give_the_same_embedding(client, image_server):
    names = ["photo.jpg", "cmyk.jpg", "animated.gif"]
    by_bytes = client.embed_images(CLIP_MODEL, [IMAGES[n] for n in names])
    by_url = client.embed_images(CLIP_MODEL, [image_server.url(f"/img/{n}") for n in names])
    np.testing.assert_allclose(by_bytes, by_url, atol=1e-6)


def test_data_uri_and_redirect_reach_the_image(client, image_server, clip_reference):
    data_uri = "data:image/png;base64," + base64.b64encode(IMAGES["photo.png"]).decode()
    got = client.embed_images(CLIP_MODEL, [data_uri, image_server.url("/to-photo")])
    assert _min_cos(got[0], clip_reference[1](IMAGES["photo.png"])) >= 0.9999
    assert _min_cos(got[1], clip_reference[1](IMAGES["photo.jpg"])) >= 0.9999


def test_text_and_image_share_one_space(client):
    text = client.embed_texts(f"{CLIP_MODEL}_text", ["a photo"])
    image = client.embed_images(CLIP_MODEL, [IMAGES["photo.jpg"]])
    assert text.shape[1] == image.shape[1]
    np.testing.assert_allclose(np.linalg.norm(image, axis=1), 1.0, atol=1e-5)


def _bad_urls(image_server) -> dict[str, tuple[str, str]]:
    """URL -> (expected status word, message fragment)."""
    u = image_server.url
    return {
        "404": (u("/missing.jpg"), "404"),
        "500": (u("/status/500"), "500"),
        "refused": (f"http://127.0.0.1:{closed_port()}/x.jpg", "refused"),
        "timeout": (u("/hang"), "timed out"),
        "drip": (u("/drip"), "timed out"),
        "loop": (u("/loop/a"), "redirect"),
        "to-metadata": (u("/to-metadata"), "169.254.169.254"),
        "file": ("file:///etc/passwd", "scheme"),
        "ftp": ("ftp://127.0.0.1/x.jpg", "scheme"),
        "private": ("http://10.1.2.3/x.jpg", "private"),
        "big": (u("/big"), "bytes"),
        "html": (u("/html"), "content type"),
    }


@pytest.mark.parametrize(
    "case",
    [
        "404",
        "500",
        "refused",
        "timeout",
        "drip",
        "loop",
        "to-metadata",
        "file",
        "ftp",
        "private",
        "big",
        "html",
    ],
)
def test_bad_url_fails_only_its_request(server, image_server, case):
    url, fragment = _bad_urls(image_server)[case]
    good = image_server.url("/img/photo.jpg")

    def send(item: str):
        tc = httpclient.InferenceServerClient(server.http_url)
        inp = httpclient.InferInput("IMAGE_URL", [1, 1], "BYTES")
        inp.set_data_from_numpy(np.array([[item.encode()]], dtype=np.object_))
        try:
            return tc.infer(f"{CLIP_MODEL}_image_url", [inp]).as_numpy("EMBEDDING")
        except InferenceServerException as exc:
            return exc
        finally:
            tc.close()

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(send, [good, url, good, good]))
    bad = results[1]
    assert isinstance(bad, InferenceServerException), case
    assert fragment.lower() in str(bad).lower(), str(bad)
    assert url[:40] in str(bad)
    for ok in (results[0], results[2], results[3]):
        assert isinstance(ok, np.ndarray)


@pytest.mark.parametrize(
    ("payload", "fragment"),
    [
        (b"", "empty"),
        (b"this is not an image at all", "not"),
        (IMAGES["photo.jpg"][: len(IMAGES["photo.jpg"]) // 2], "truncated"),
        (decompression_bomb(), "pixels"),
    ],
    ids=["empty", "garbage", "truncated-jpeg", "decompression-bomb"],
)
def test_bad_image_bytes_fail_with_a_clear_message(client, payload, fragment):
    with pytest.raises(EmbeddingClientError) as info:
        client.embed_images(CLIP_MODEL, [IMAGES["photo.png"], payload])
    assert fragment in str(info.value).lower()
    assert client.embed_images(CLIP_MODEL, [IMAGES["photo.png"]]).shape[0] == 1


def test_32_clients_mixing_good_and_bad_urls(server, image_server, clip_reference):
    good = {n: image_server.url(f"/img/{n}") for n in ("photo.jpg", "photo.png", "tall.png")}
    bad = [image_server.url("/missing.jpg"), "http://10.0.0.1/a.jpg", image_server.url("/html")]
    want = {n: clip_reference[1](IMAGES[n]) for n in good}

    def work(i: int):
        with server.client("http" if i % 2 else "grpc") as c:
            if i % 4 == 3:
                try:
                    c.embed_images(f"{CLIP_MODEL}_image_url", [bad[i % len(bad)]])
                except EmbeddingClientError:
                    return True
                return False
            name = list(good)[i % len(good)]
            got = c.embed_images(f"{CLIP_MODEL}_image_url", [good[name]])[0]
            return _min_cos(got, want[name]) >= 0.9999

    with ThreadPoolExecutor(32) as pool:
        assert all(pool.map(work, range(64)))
    with server.client() as c:
        assert c.is_server_ready()
