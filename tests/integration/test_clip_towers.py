"""OpenCLIP beyond classic CLIP on the real server: MobileCLIP-, EVA-, PE-, CoCa-, SigLIP-shaped.

The module builds its own repository from the tiny random-init models of
:mod:`generator.fixtures.tiny_clip_towers` (``CustomTextCLIP`` with timm FastViT, EVA02
and Perception Encoder image towers, ``CoCa``, and a SigLIP-style model given as an
open_clip ``local-dir:`` folder with its Hugging Face tokenizer files) and
:mod:`generator.fixtures.tiny_clip_hf_text` (XLM-R, mT5 and NLLB-like text towers,
``hf_model_name``, whose folders also hold the text model's ``config.json``), and starts
its own Triton.
Each model's ``_text`` and ``_image`` ensembles are held, over HTTP and gRPC, to
open_clip in PyTorch loaded the way users load a checkpoint; one model is also loaded at
runtime through ``model_manager`` (which builds in a worker process).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from client.load.corpus import varied_sentences
from generator.manifest import load_manifest
from tests.integration.clip_fixture import ClipReference, sample_images
from tests.integration.conftest import serve, write_manifest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TOWER_ARCHS = ("tiny-coca", "tiny-eva", "tiny-mobileclip", "tiny-pe-core", "tiny-siglip")
HF_TEXT = {"tiny-xlmr": "xlmr", "tiny-mt5": "mt5", "tiny-nllb": "nllb"}  # fixture variants
ARCHS = (*TOWER_ARCHS, *HF_TEXT)
# SigLIP-shaped, logit scale 4 and bias -0.5: served for the scores test alone, where its
# sigmoid probabilities are mid-range (tiny-siglip's sit near 0)
MID_SIGLIP = "tiny-siglip-mid"
IMAGES = sample_images()
NAMES = sorted(IMAGES)
TEXTS = [*varied_sentences(24), "A DIAGRAM, with “quotes” &amp; entities", "snake_case (x)!"]
# Served vs open_clip, fp32 (measured on the 2-core machine: <= 4.8e-7 for every arch).
SERVED_MAX_ABS = 1e-5
# client scores from served embeddings vs open_clip's forward (probabilities)
SCORE_MAX_ABS = 1e-5


@pytest.fixture(scope="module")
def towers(tmp_path_factory):
    """(server, {arch: manifest fields}) for a repository serving the tiny models."""
    from generator.fixtures.tiny_clip_hf_text import create_tiny_xlmr_clip
    from generator.fixtures.tiny_clip_towers import create_tiny_tower_model

    base = tmp_path_factory.mktemp("clip-towers")
    fields = {
        arch: create_tiny_tower_model(arch, base / arch, seed=0)
        for arch in (*TOWER_ARCHS, MID_SIGLIP)
    }
    for arch, variant in HF_TEXT.items():
        fields[arch] = create_tiny_xlmr_clip(base / arch, seed=0, variant=variant)
    entries = [
        {"name": arch, "family": "open-clip", "max_batch_size": 8, **fields[arch]}
        for arch in (*ARCHS, MID_SIGLIP)
    ]
    manager = {"allowed_roots": [str(base)], "health_probe_interval_s": 0}
    write_manifest(base / "models.toml", {"models": entries, "model_manager": manager})
    with serve(load_manifest(base / "models.toml"), base) as server:
        yield server, fields


@pytest.fixture(scope="module")
def references(towers):
    _, fields = towers
    return {arch: ClipReference(f["arch"], f.get("checkpoint")) for arch, f in fields.items()}


def _max_abs(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got.astype(np.float64) - want.astype(np.float64)).max())


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("arch", ARCHS)
def test_served_text_matches_open_clip(towers, references, arch, protocol):
    server, _ = towers
    with server.client(protocol) as client:
        got = client.embed_texts(f"{arch}_text", TEXTS)
    want = references[arch].text(TEXTS)
    print(f"\n{arch} served text {protocol}: max abs {_max_abs(got, want):.1e}")
    assert got.shape == want.shape
    assert _max_abs(got, want) <= SERVED_MAX_ABS


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("arch", ARCHS)
def test_served_images_match_open_clip(towers, references, arch, protocol):
    server, _ = towers
    with server.client(protocol) as client:
        got = client.embed_images(arch, [IMAGES[name] for name in NAMES])
    want = references[arch].images([IMAGES[name] for name in NAMES])
    print(f"\n{arch} served images {protocol}: max abs {_max_abs(got, want):.1e}")
    assert got.shape == want.shape
    for row, name in enumerate(NAMES):
        assert _max_abs(got[row], want[row]) <= SERVED_MAX_ABS, name


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("arch", ["tiny-siglip", MID_SIGLIP, "tiny-mobileclip"])
def test_client_scores_equal_open_clips(towers, references, arch, protocol):
    """SigLIP: sigmoid(img @ txt.T * logit_scale.exp() + logit_bias); CLIP: softmax per image.

    ``tiny-siglip-mid`` holds the sigmoid where it is steepest: its probabilities are
    mid-range (checked), so an error in scale or bias shows as a large difference.
    """
    import torch

    server, _ = towers
    blobs, texts = [IMAGES[name] for name in NAMES], TEXTS[:6]
    with server.client(protocol) as client:
        logits = client.clip_logit_params(arch)
        got = client.clip_scores(
            arch, client.embed_images(arch, blobs), client.embed_texts(f"{arch}_text", texts)
        )
    ref = references[arch]
    with torch.no_grad():
        image, text, scale, *rest = ref.model(ref.pixels(blobs), ref.tokenizer(texts))
        if arch in ("tiny-siglip", MID_SIGLIP):
            want = torch.sigmoid(image @ text.T * scale + rest[0]).numpy()
        else:
            want = (scale * image @ text.T).softmax(dim=-1).numpy()
    sigmoid = arch in ("tiny-siglip", MID_SIGLIP)
    assert logits.sigmoid == sigmoid
    assert logits.scale == float(scale.item())
    if sigmoid:
        assert logits.bias == float(rest[0].item())
    if arch == MID_SIGLIP:
        assert (logits.scale, logits.bias) == (4.0, -0.5)
        assert 0.05 < want.min() and want.max() < 0.95 and np.ptp(want) > 0.2  # not saturated
    spread = f"{want.min():.2e}..{want.max():.2e}"
    print(f"\n{arch} scores {protocol}: max abs {_max_abs(got, want):.1e}, range {spread}")
    assert got.shape == want.shape
    assert _max_abs(got, want) <= SCORE_MAX_ABS


def test_model_manager_loads_a_coca_checkpoint(towers):
    """The runtime path (worker-process build) serves CoCa as the manifest build does."""
    server, fields = towers
    image = IMAGES["photo.jpg"]
    with server.client() as client:
        coca = fields["tiny-coca"]
        answer = client.load_open_clip(coca["arch"], checkpoint=coca["checkpoint"], name="rt-coca")
        try:
            assert answer["status"] == "loaded"
            np.testing.assert_allclose(
                client.embed_texts("rt-coca_text", TEXTS),
                client.embed_texts("tiny-coca_text", TEXTS),
                atol=1e-6,
            )
            np.testing.assert_allclose(
                client.embed_images("rt-coca", [image]),
                client.embed_images("tiny-coca", [image]),
                atol=1e-6,
            )
        finally:
            assert client.delete_model("rt-coca")["status"] == "deleted"


def test_model_manager_serves_a_checkpoint_with_its_tags_preprocessing(towers):
    """preprocess_of through a runtime load: open_clip's MobileCLIP tag pixels, served."""
    from generator.families.open_clip.assets import load_open_clip
    from generator.families.open_clip.preprocess_cfg import PreprocessChoice

    server, fields = towers
    mc = fields["tiny-mobileclip"]
    tag = "MobileCLIP-S1/datacompdr"
    blobs = [IMAGES[name] for name in NAMES]
    ref = ClipReference(mc["arch"], mc["checkpoint"])
    ref.model, ref.preprocess, ref.tokenizer = load_open_clip(
        mc["arch"], checkpoint=mc["checkpoint"], preprocess=PreprocessChoice(tag)
    )
    with server.client() as client:
        answer = client.load_open_clip(
            mc["arch"], checkpoint=mc["checkpoint"], name="rt-mc", preprocess_of=tag
        )
        try:
            assert answer["status"] == "loaded"
            got = client.embed_images("rt-mc", blobs)
            default = client.embed_images("tiny-mobileclip", blobs)
        finally:
            assert client.delete_model("rt-mc")["status"] == "deleted"
    want = ref.images(blobs)
    print(f"\nrt-mc ({tag}) served vs open_clip: max abs {_max_abs(got, want):.1e}")
    assert _max_abs(got, want) <= SERVED_MAX_ABS
    assert _max_abs(default, want) > 100 * SERVED_MAX_ABS  # the file alone: other pixels


def test_model_manager_refuses_an_unreproducible_pooling_by_name(towers):
    """A text tower with pool_type 'none' is refused naming it, through the worker build."""
    import json

    import open_clip
    import torch

    from client.errors import EmbeddingClientError
    from generator.fixtures.tiny_clip import tiny_model_config

    server, fields = towers
    base = Path(fields["tiny-coca"]["checkpoint"]).parent.parent / "pool-none"
    base.mkdir(exist_ok=True)
    cfg = tiny_model_config()
    cfg["text_cfg"]["pool_type"] = "none"
    arch = base / "tiny-pool-none.json"
    arch.write_text(json.dumps(cfg))
    open_clip.add_model_config(arch)
    torch.save(open_clip.create_model(arch.stem).state_dict(), base / "weights.pt")
    with server.client() as client:
        with pytest.raises(EmbeddingClientError, match="text pool_type 'none'"):
            client.load_open_clip(str(arch), checkpoint=str(base / "weights.pt"), name="rt-bad")
        assert "rt-bad" not in {m["name"] for m in client.managed_models()}
