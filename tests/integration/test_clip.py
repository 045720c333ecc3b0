"""OpenCLIP through the real server: all three ensembles against open_clip in PyTorch."""

from __future__ import annotations

import base64
import io
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from PIL import Image
from tritonclient.utils import InferenceServerException

from client import EmbeddingClientError
from client.load.corpus import varied_sentences
from generator.families.open_clip.assets import HARD_TEXTS
from generator.fixtures.caption_corpus import caption_corpus
from tests.http_servers import ImageServer, closed_port
from tests.integration.clip_fixture import (
    CLIP_MODEL,
    ClipReference,
    decompression_bomb,
    mirrored,
    sample_images,
)

pytestmark = pytest.mark.integration
IMAGES = sample_images()
# Gates: about 30 x the figures measured on the 2-core CI machine, HTTP and gRPC alike.
# Text (64 varied sentences): 1-cos 4.4e-13, max abs 3.9e-7. Images, the worst of the
# 12 kinds (deep16.png; the others 6e-8 to 9e-8): 1-cos 6.7e-14, max abs 1.6e-7.
TEXT_MAX_COS_GAP = 1e-11
TEXT_MAX_ABS = 1e-5
IMAGE_MAX_COS_GAP = 2e-12
IMAGE_MAX_ABS = 5e-6
# Distinct pictures (no re-encodings of one picture), and a mirror image of photo.jpg.
DISTINCT = [
    "animated.gif",
    "deep16.png",
    "gray.png",
    "panorama.jpg",
    "photo.jpg",
    "pixel.png",
    "rgba.png",
    "tall.png",
]
MIRRORED = mirrored(IMAGES["photo.jpg"])
CONTROL_TEXTS = [
    "a photo of a cat",
    "a photo of a dog",
    "a diagram of a network",
    "東京の夜景",
    "x",
    "two dogs playing in the snow",
    "a red car",
]
# Measured: different pictures 1-cos >= 8.5e-4 (photo.jpg vs its mirror image), different
# texts >= 0.12; the same photo sent four ways, or a text repeated or upper-cased: exact.
DISTINCT_MIN_COS_GAP = 1e-4
DISTINCT_TEXT_MIN_COS_GAP = 1e-2
# Logits (logit_scale 14.3) of served embeddings vs open_clip's forward: measured 3.0e-6.
LOGIT_MAX_ABS = 1e-4


@pytest.fixture(scope="session")
def clip_reference(server) -> ClipReference:
    entry = server.manifest.get(CLIP_MODEL)
    return ClipReference(entry.arch, entry.checkpoint)


@pytest.fixture(scope="session")
def image_server():
    with ImageServer({**IMAGES, "bomb.png": decompression_bomb()}, hang_s=6.0) as srv:
        yield srv


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = np.atleast_2d(a).astype(np.float64), np.atleast_2d(b).astype(np.float64)
    return np.sum(a * b, axis=1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def _gaps(got: np.ndarray, want: np.ndarray) -> tuple[float, float]:
    """(1 - the minimum row cosine, the maximum absolute difference), in float64."""
    return float(1.0 - _cosines(got, want).min()), float(np.abs(got - want).max())


def _assert_image_parity(got: np.ndarray, want: np.ndarray, label: str) -> None:
    cos_gap, max_abs = _gaps(got, want)
    assert cos_gap <= IMAGE_MAX_COS_GAP, f"{label}: 1-cos {cos_gap:.1e}"
    assert max_abs <= IMAGE_MAX_ABS, f"{label}: max abs {max_abs:.1e}"


def _data_uri(name: str) -> str:
    mime = {"jpg": "jpeg", "gif": "gif"}.get(name.rsplit(".", 1)[-1], "png")
    return f"data:image/{mime};base64," + base64.b64encode(IMAGES[name]).decode()


def _unit(rows: np.ndarray) -> np.ndarray:
    rows = rows.astype(np.float64)
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def _pairwise_cos_gaps(rows: np.ndarray) -> np.ndarray:
    """1 - cosine of every pair of rows (i < j)."""
    unit = _unit(rows)
    return 1.0 - (unit @ unit.T)[np.triu_indices(len(rows), k=1)]


def test_text_ensemble_matches_open_clip(client, clip_reference):
    texts = varied_sentences(64)
    got = client.embed_texts(f"{CLIP_MODEL}_text", texts)
    cos_gap, max_abs = _gaps(got, clip_reference.text(texts))
    print(f"\nclip text {client.protocol}: 1-cos {cos_gap:.1e}, max abs {max_abs:.1e}")
    assert cos_gap <= TEXT_MAX_COS_GAP
    assert max_abs <= TEXT_MAX_ABS


def test_scraped_captions_match_open_clip(client, clip_reference):
    """Entities of every form, mojibake, markup, bidi: cleaned as open_clip cleans them."""
    corpus = [t for t in caption_corpus(seed=0)[::47] if t.strip() and "\u0558" not in t]
    texts = [*HARD_TEXTS, "&#233;t&#xe9; &#8212; &#x2014;", *corpus]
    got = client.embed_texts(f"{CLIP_MODEL}_text", texts)
    cos_gap, max_abs = _gaps(got, clip_reference.text(texts))
    print(f"\nclip scraped text {client.protocol}: 1-cos {cos_gap:.1e}, max abs {max_abs:.1e}")
    assert cos_gap <= TEXT_MAX_COS_GAP
    assert max_abs <= TEXT_MAX_ABS


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("a\u0558b", "holds U+0558, a character of a Unicode version newer"),
        ("wow!!<end_of_text>", "holds '<end_of_text>' right after '!'"),
    ],
    ids=["unicode-16-letter", "special-after-punctuation"],
)
def test_unmatchable_caption_is_refused_alone_with_the_reason(client, text, reason):
    with pytest.raises(EmbeddingClientError) as info:
        client.embed_texts(f"{CLIP_MODEL}_text", ["a photo of a cat", text])
    assert info.value.status == STATUS["refused"][client.protocol]
    assert reason in info.value.message and "so it is refused" in info.value.message
    assert client.embed_texts(f"{CLIP_MODEL}_text", ["a photo of a cat"]).shape[0] == 1


@pytest.mark.parametrize("name", sorted(IMAGES))
def test_image_ensemble_matches_open_clip(client, clip_reference, name):
    got = client.embed_images(CLIP_MODEL, [IMAGES[name]])
    want = clip_reference.image(IMAGES[name])
    cos_gap, max_abs = _gaps(got, want)
    print(f"\nclip {name} {client.protocol}: 1-cos {cos_gap:.1e}, max abs {max_abs:.1e}")
    _assert_image_parity(got, want, name)


def test_different_images_embed_differently(client, image_server, clip_reference, tmp_path):
    """The tiny random model puts all images in a narrow cone, but never on one point."""
    (tmp_path / "photo.jpg").write_bytes(IMAGES["photo.jpg"])
    same = [
        IMAGES["photo.jpg"],
        image_server.url("/img/photo.jpg"),
        _data_uri("photo.jpg"),
        str(tmp_path / "photo.jpg"),
    ]
    same_gaps = _pairwise_cos_gaps(client.embed_images(CLIP_MODEL, same))
    different = [IMAGES[name] for name in DISTINCT] + [MIRRORED]
    served = client.embed_images(CLIP_MODEL, different)
    gaps = _pairwise_cos_gaps(served)
    print(f"\nsame photo 1-cos <= {same_gaps.max():.1e}; different >= {gaps.min():.1e}")
    assert same_gaps.max() <= IMAGE_MAX_COS_GAP
    assert gaps.min() >= DISTINCT_MIN_COS_GAP
    want = clip_reference.images(different)
    nearest = np.argmax(_unit(served) @ _unit(want).T, axis=1)
    assert nearest.tolist() == list(range(len(different)))


def test_different_texts_embed_differently(client):
    texts = [*CONTROL_TEXTS, CONTROL_TEXTS[0], CONTROL_TEXTS[0].upper()]
    got = client.embed_texts(f"{CLIP_MODEL}_text", texts)
    different = _pairwise_cos_gaps(got[: len(CONTROL_TEXTS)])
    same = _pairwise_cos_gaps(got[[0, -2, -1]])  # a repeat, and the tokenizer's lower-casing
    print(f"\nsame text 1-cos <= {same.max():.1e}; different >= {different.min():.1e}")
    assert same.max() <= TEXT_MAX_COS_GAP
    assert different.min() >= DISTINCT_TEXT_MIN_COS_GAP


def test_similarity_matrix_matches_open_clip(client, clip_reference):
    """logit_scale * image @ text.T from served embeddings vs open_clip's own forward."""
    blobs = [IMAGES[name] for name in DISTINCT]
    image = client.embed_images(CLIP_MODEL, blobs)
    text = client.embed_texts(f"{CLIP_MODEL}_text", CONTROL_TEXTS)
    scale = clip_reference.model.logit_scale.detach().exp().item()
    got = scale * image @ text.T
    want = clip_reference.logits_per_image(blobs, CONTROL_TEXTS)
    top2 = np.sort(want, axis=1)[:, -2:]
    print(
        f"\nlogits {client.protocol}: max abs {np.abs(got - want).max():.1e}, "
        f"smallest top-1 margin {np.min(top2[:, 1] - top2[:, 0]):.3f}"
    )
    assert got.shape == (len(DISTINCT), len(CONTROL_TEXTS))
    np.testing.assert_allclose(got, want, rtol=0, atol=LOGIT_MAX_ABS)
    assert np.min(top2[:, 1] - top2[:, 0]) > 2 * LOGIT_MAX_ABS  # each argmax is decided
    assert np.argmax(got, axis=1).tolist() == np.argmax(want, axis=1).tolist()
    assert np.argmax(got, axis=0).tolist() == np.argmax(want, axis=0).tolist()


def test_mixed_inputs_in_one_call_come_back_in_input_order(
    client, image_server, clip_reference, tmp_path
):
    """Bytes, URLs, a data: URI and file paths in one list: split, sent, put back in order."""
    for name in ("rgba.png", "panorama.jpg"):
        (tmp_path / name).write_bytes(IMAGES[name])
    items = [
        ("image_url", "tall.png", image_server.url("/img/tall.png")),
        ("image", "photo.jpg", IMAGES["photo.jpg"]),
        ("image_url", "gray.png", _data_uri("gray.png")),
        ("image", "rgba.png", str(tmp_path / "rgba.png")),
        ("image", "animated.gif", IMAGES["animated.gif"]),
        ("image", "panorama.jpg", tmp_path / "panorama.jpg"),
        ("image_url", "deep16.png", image_server.url("/img/deep16.png")),
    ]
    got = client.embed_images(CLIP_MODEL, [item for _, _, item in items])
    assert got.shape[0] == len(items)
    for row, (ensemble, name, item) in enumerate(items):
        alone = client.embed_images(f"{CLIP_MODEL}_{ensemble}", [item])[0]
        np.testing.assert_allclose(got[row], alone, rtol=0, atol=1e-6, err_msg=f"row {row}")
        _assert_image_parity(got[row], clip_reference.image(IMAGES[name]), f"row {row} {name}")


def test_url_and_bytes_give_the_same_embedding(client, image_server):
    names = ["photo.jpg", "cmyk.jpg", "animated.gif"]
    by_bytes = client.embed_images(CLIP_MODEL, [IMAGES[n] for n in names])
    by_url = client.embed_images(CLIP_MODEL, [image_server.url(f"/img/{n}") for n in names])
    np.testing.assert_allclose(by_bytes, by_url, atol=1e-6)


def test_data_uri_and_redirect_reach_the_image(client, image_server, clip_reference):
    got = client.embed_images(CLIP_MODEL, [_data_uri("photo.png"), image_server.url("/to-photo")])
    _assert_image_parity(got[0], clip_reference.image(IMAGES["photo.png"]), "data: URI")
    _assert_image_parity(got[1], clip_reference.image(IMAGES["photo.jpg"]), "redirect")


def test_text_and_image_share_one_space(client):
    text = client.embed_texts(f"{CLIP_MODEL}_text", ["a photo"])
    image = client.embed_images(CLIP_MODEL, [IMAGES["photo.jpg"]])
    assert text.shape[1] == image.shape[1]
    np.testing.assert_allclose(np.linalg.norm(image, axis=1), 1.0, atol=1e-5)


STATUS = {
    "refused": {"http": "400", "grpc": "StatusCode.INVALID_ARGUMENT"},
    "unavailable": {"http": "503", "grpc": "StatusCode.UNAVAILABLE"},
}


def _bad_urls(image_server, closed: int) -> dict[str, tuple[str, str, str]]:
    """case -> (URL, refused | unavailable, the exact reason after the URL)."""
    u = image_server.url
    timeout = "timed out (connect_timeout_s=3, read_timeout_s=2)"
    hint = "(add the host to allow_hosts to permit it)"
    return {
        "404": (u("/missing.jpg"), "refused", "HTTP 404 Not Found"),
        "500": (u("/status/500"), "unavailable", "HTTP 500 Internal Server Error"),
        "refused": (
            f"http://127.0.0.1:{closed}/x.jpg",
            "unavailable",
            f"connection to 127.0.0.1:{closed} refused",
        ),
        "timeout": (u("/hang"), "unavailable", timeout),
        "drip": (u("/drip"), "unavailable", timeout),
        "loop": (u("/loop/a"), "refused", "redirect loop"),
        "to-metadata": (
            u("/to-metadata"),
            "refused",
            f"address 169.254.169.254 is link-local {hint} "
            "(after redirect to 'http://169.254.169.254/latest/meta-data/')",
        ),
        "file": (
            "file:///etc/passwd",
            "refused",
            "scheme 'file' is not allowed (allowed: http, https)",
        ),
        "ftp": (
            "ftp://127.0.0.1/x.jpg",
            "refused",
            "scheme 'ftp' is not allowed (allowed: http, https)",
        ),
        "private": ("http://10.1.2.3/x.jpg", "refused", f"address 10.1.2.3 is private {hint}"),
        "big": (u("/big"), "refused", "body is over max_bytes=2000000 (Content-Length 3000000)"),
        "html": (u("/html"), "refused", "content type 'text/html' is not an image"),
    }


@pytest.mark.parametrize("protocol", ["http", "grpc"])
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
def test_bad_url_fails_only_its_request(server, image_server, case, protocol):
    url, kind, reason = _bad_urls(image_server, closed_port())[case]
    good = image_server.url("/img/photo.jpg")
    module = grpcclient if protocol == "grpc" else httpclient
    address = server.grpc_url if protocol == "grpc" else server.http_url

    def send(item: str):
        tc = module.InferenceServerClient(address)
        inp = module.InferInput("IMAGE_URL", [1, 1], "BYTES")
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
    assert str(bad.status()) == STATUS[kind][protocol]
    expected = f"in ensemble '{CLIP_MODEL}_image_url', IMAGE_URL '{url}' {kind}: {reason}"
    assert bad.message() == expected
    for ok in (results[0], results[2], results[3]):
        assert isinstance(ok, np.ndarray)


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b"", "IMAGE is empty"),
        (
            b"this is not an image at all",
            "IMAGE is not a supported image (formats: JPEG, MPO, PNG, GIF, WEBP, BMP, TIFF, AVIF)",
        ),
        (
            IMAGES["photo.jpg"][: len(IMAGES["photo.jpg"]) // 2],
            "IMAGE could not be decoded: image file is truncated (0 bytes not processed)",
        ),
        (decompression_bomb(), "IMAGE refused as a decompression bomb: Image size (1600000000"),
    ],
    ids=["empty", "garbage", "truncated-jpeg", "decompression-bomb"],
)
def test_bad_image_bytes_fail_with_a_clear_message(client, payload, reason):
    with pytest.raises(EmbeddingClientError) as info:
        client.embed_images(CLIP_MODEL, [IMAGES["photo.png"], payload])
    assert info.value.status == STATUS["refused"][client.protocol]
    assert info.value.message.startswith(f"in ensemble '{CLIP_MODEL}_image', {reason}")
    assert client.embed_images(CLIP_MODEL, [IMAGES["photo.png"]]).shape[0] == 1


def test_32_clients_mixing_good_and_bad_urls(server, image_server, clip_reference):
    good = {n: image_server.url(f"/img/{n}") for n in ("photo.jpg", "photo.png", "tall.png")}
    bad = [image_server.url("/missing.jpg"), "http://10.0.0.1/a.jpg", image_server.url("/html")]
    want = {n: clip_reference.image(IMAGES[n]) for n in good}

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
            cos_gap, max_abs = _gaps(got, want[name])
            return cos_gap <= IMAGE_MAX_COS_GAP and max_abs <= IMAGE_MAX_ABS

    with ThreadPoolExecutor(32) as pool:
        assert all(pool.map(work, range(64)))
    with server.client() as c:
        assert c.is_server_ready()


def test_exif_orientation_is_ignored_by_default_as_open_clip_does(client, clip_reference):
    """``image_apply_exif`` is off by default: the stored pixels, as open_clip reads them."""
    from PIL import ImageOps

    data = IMAGES["rotated.jpg"]
    got = client.embed_images(CLIP_MODEL, [data])
    _assert_image_parity(got, clip_reference.image(data)[None], "rotated.jpg")
    upright = io.BytesIO()
    ImageOps.exif_transpose(Image.open(io.BytesIO(data))).save(upright, "PNG")
    turned = clip_reference.image(upright.getvalue())[None]
    assert 1.0 - _cosines(got, turned).min() >= DISTINCT_MIN_COS_GAP
