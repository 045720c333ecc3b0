"""The sparse-encoder family: declaration, manifest checks and export parity.

Tiny random SPLADE models (``generator/fixtures/tiny_splade.py``: max pooling with relu,
sum pooling with log1p_relu and a max_active_dims of its own) are exported by the
family's ``build``; the graph, run by the serving encoder (ragged requests,
length-sorted chunks) and turned into active dimensions by ``embed_runtime.sparse``,
is compared made dense with ``SparseEncoder.encode`` of an independent load.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pytest

from embed_runtime.ort_encoder import EncoderParams, OrtEncoder
from embed_runtime.sparse import densify, sparse_rows, unpad
from embed_runtime.tokenizer import BatchTokenizer, TokenizerParams, split_rows
from generator.declared_kind import UnsupportedModelError, check_source
from generator.families import FAMILIES
from generator.families.sparse_encoder import export as family
from generator.fixtures.tiny_splade import create_tiny_splade
from generator.lifecycle import parse_request
from generator.manifest import ManifestError, parse_manifest
from generator.render import parse_config
from tests.st_factory import parity_texts

MAX_ABS_DIFF = 1e-5
SPARSE = FAMILIES["sparse-encoder"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    """Two tiny SPLADE folders: max/relu, and sum/log1p_relu with max_active_dims 40."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    root = tmp_path_factory.mktemp("splade")
    return {
        "max": create_tiny_splade(root / "max", seed=1),
        "sum": create_tiny_splade(root / "sum", seed=2, pooling="sum",
                                  activation="log1p_relu", max_active_dims=40),
    }


def _build(folder: Path, work: Path, **fields):
    manifest = parse_manifest(
        {"models": [{"name": "sp", "family": "sparse-encoder", "source": str(folder),
                     "max_rows_per_run": 4, **fields}]}, work)
    return family.build(manifest.models[0], manifest, work / "work")


def _served(dirs, texts: list[str], requests: int = 3):
    """Rows as the served steps answer them: tokenize, ragged ORT run, per request."""
    tokenize, encode, _ = dirs
    tok = {k: v.string_value for k, v in parse_config(tokenize.config).parameters.items()}
    raw = {k: v.string_value for k, v in parse_config(encode.config).parameters.items()}
    params = EncoderParams.from_parameters(raw | {"weight_cache": "false"})
    tokenizer = BatchTokenizer(str(tokenize.files["tokenizer.json"]),
                               TokenizerParams.from_parameters(tok))
    encoder = OrtEncoder(str(encode.files["model.onnx"]), params)
    parts = np.array_split(np.arange(len(texts)), requests)
    counts = [len(p) for p in parts]
    tokens = split_rows(tokenizer.encode(texts), counts)
    dense = encoder.encode_tokens(tokens)
    return [sparse_rows(d, params.max_active_dims) for d in dense], params


@pytest.mark.parametrize(("kind", "fields", "k"), [
    ("max", {}, None), ("sum", {}, 40), ("max", {"max_active_dims": 7}, 7),
])
def test_served_rows_equal_sparse_encoder_encode(folders, tmp_path, kind, fields, k) -> None:
    from sentence_transformers import SparseEncoder

    dirs = _build(folders[kind], tmp_path, **fields)
    assert [d.name for d in dirs] == ["sp_tokenize", "sp_encode", "sp"]
    texts = parity_texts()
    answers, params = _served(dirs, texts)
    assert params.sparse and params.max_active_dims == (k or 0)
    reference = SparseEncoder(str(folders[kind]), device="cpu")
    want = reference.encode(texts, batch_size=8, max_active_dims=k, convert_to_tensor=True,
                            convert_to_sparse_tensor=False).numpy()
    got = np.concatenate([densify(i, v, want.shape[1]) for i, v in answers])
    diff = float(np.abs(got - want).max())
    print(f"\n{kind} {fields}: max|diff| {diff:.2e}, active dims per row "
          f"{int((want > 0).sum(1).min())}-{int((want > 0).sum(1).max())}")
    assert diff <= MAX_ABS_DIFF
    for (indices, values), rows in zip(answers, np.array_split(want, 3), strict=True):
        counts = (rows != 0).sum(1)
        assert indices.shape[1] == counts.max()  # each request its own K
        if k:
            assert counts.max() <= k
        for (index, value), row in zip(unpad(indices, values), rows, strict=True):
            assert sorted(index.tolist()) == np.flatnonzero(row).tolist()
            assert (np.diff(value) <= 0).all()


def test_rendered_configs_declare_two_outputs_and_never_the_vocabulary(folders, tmp_path):
    _, encode, ensemble = _build(folders["max"], tmp_path)
    for model_dir in (encode, ensemble):
        outputs = {o.name: (o.data_type, list(o.dims))
                   for o in parse_config(model_dir.config).output}
        assert outputs == {"SPARSE_INDICES": (8, [-1]), "SPARSE_VALUES": (11, [-1])}


def test_a_sparse_folder_is_served_by_this_family_and_pointed_to_by_the_dense_one(folders):
    check_source(SPARSE.name, SPARSE.served, str(folders["max"]), "m")
    with pytest.raises(UnsupportedModelError, match=re.escape("(use family 'sparse-encoder')")):
        check_source("sentence-transformers", FAMILIES["sentence-transformers"].served,
                     str(folders["max"]), "m")
    SPARSE.check_folder(folders["max"])


def test_dense_and_inference_free_folders_are_refused(tmp_path) -> None:
    from tests.st_factory import tokenizer_dir

    dense = "Pooling' is not supported by family 'sparse-encoder'"
    with pytest.raises(UnsupportedModelError, match=dense):
        check_source(SPARSE.name, SPARSE.served, str(tokenizer_dir()), "mini")
    routed = tmp_path / "ifree"
    routed.mkdir()
    (routed / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type":
         "sentence_transformers.base.modules.router.Router"}]))
    (routed / "config_sentence_transformers.json").write_text(
        json.dumps({"model_type": "SparseEncoder"}))
    with pytest.raises(UnsupportedModelError, match="inference-free sparse encoders"):
        check_source(SPARSE.name, SPARSE.served, str(routed), "ifree")


def test_manifest_keeps_max_active_dims_to_this_family(tmp_path) -> None:
    with pytest.raises(ManifestError) as exc:
        parse_manifest({"models": [
            {"name": "d", "family": "sentence-transformers", "source": "x", "max_active_dims": 8},
            {"name": "s", "family": "sparse-encoder", "source": "x", "max_active_dims": 0},
            {"name": "t", "family": "sparse-encoder", "source": "x",
             "encoder_backend": "onnxruntime"},
        ]}, tmp_path)
    text = str(exc.value)
    assert "(d): max_active_dims needs family 'sparse-encoder'" in text
    assert "(s): max_active_dims must be within [1" in text
    assert "(t): sparse-encoder needs encoder_backend 'python-ort'" in text
    entry = parse_manifest({"models": [{"name": "s", "family": "sparse-encoder", "source": "x",
                                        "max_active_dims": 64}]}, tmp_path).models[0]
    assert entry.model_dirs == ("s", "s_tokenize", "s_encode")


def test_a_runtime_load_request_names_the_family() -> None:
    request = parse_request(json.dumps({"action": "load", "family": "sparse-encoder",
                                        "source": "/models/splade", "name": "sp",
                                        "options": {"max_active_dims": 32}}))
    assert request["family"] == "sparse-encoder"


def test_model_manager_checks_a_sparse_folder_by_this_family(folders, tmp_path) -> None:
    from embed_runtime.errors import InvalidInputError
    from generator.manifest import ManagerSettings
    from tests.unit.generator.test_lifecycle import _load, _manager

    manager = _manager(tmp_path / "srv", roots=[folders["max"].parent])
    settings = ManagerSettings(allowed_roots=(str(folders["max"].parent),))
    request = _load(str(folders["max"]), "sp") | {"family": "sparse-encoder"}
    assert manager._source_fields(request, settings)["source"] == str(folders["max"])
    with pytest.raises(InvalidInputError, match="use family 'sparse-encoder'"):
        manager.handle(_load(str(folders["max"]), "sp"))
