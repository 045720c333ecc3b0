"""The sparse-encoder family: declaration, manifest checks and export parity.

Tiny random SPLADE models (``generator/fixtures/tiny_splade.py``: max pooling with relu,
sum pooling with log1p_relu and a max_active_dims of its own) are exported by the
family's ``build``; the graph, run by the serving encoder (ragged requests,
length-sorted chunks) and turned into active dimensions by ``embed_runtime.engines.sparse``,
is compared made dense with ``SparseEncoder.encode`` of an independent load.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pytest

from embed_runtime.engines.ort_encoder import EncoderParams, OrtEncoder
from embed_runtime.engines.sparse import densify, sparse_rows, unpad
from embed_runtime.text.tokenizer import BatchTokenizer, TokenizerParams, split_rows
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


def test_dense_folders_and_a_router_without_its_config_are_refused(tmp_path) -> None:
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


# --- inference-free (a Router: static query weights, SPLADE documents) -----------------


@pytest.fixture(scope="module")
def free_folder(tmp_path_factory) -> Path:
    from generator.fixtures.tiny_splade import create_tiny_inference_free_splade

    return create_tiny_inference_free_splade(tmp_path_factory.mktemp("free") / "free", seed=2)


def test_an_inference_free_folder_is_served_here_and_refused_by_the_dense_family(free_folder):
    from generator.declared_kind import declared_kind

    kind = declared_kind(free_folder)
    assert kind.routes == (("document", ("Transformer", "SpladePooling")),
                           ("query", ("SparseStaticEmbedding",)))
    assert kind.default_route == "document" and kind.transformer_task == "fill-mask"
    check_source(SPARSE.name, SPARSE.served, str(free_folder), "free")
    SPARSE.check_folder(free_folder)
    with pytest.raises(UnsupportedModelError, match=re.escape("(use family 'sparse-encoder')")):
        check_source("sentence-transformers", FAMILIES["sentence-transformers"].served,
                     str(free_folder), "free")


def _edited_router(folder: Path, tmp_path: Path, edit) -> Path:
    import shutil

    copy = shutil.copytree(folder, tmp_path / "edited")
    path = copy / "router_config.json"
    config = json.loads(path.read_text())
    edit(config)
    path.write_text(json.dumps(config))
    return copy


@pytest.mark.parametrize(("edit", "message"), [
    (lambda c: c["structure"].update(query=c["structure"]["document"]),
     "routes \\[document: Transformer \\+ SpladePooling; query: Transformer \\+ SpladePooling\\]"),
    (lambda c: c["structure"].update(extra=c["structure"]["query"]), "routes \\[document"),
    (lambda c: c["parameters"].update(default_route="query"), "default route other than"),
    (lambda c: c["parameters"].update(route_mappings={"query,text": "document"}),
     "route mappings"),
])
def test_other_routers_are_refused_naming_what_differs(free_folder, tmp_path, edit, message):
    edited = _edited_router(free_folder, tmp_path, edit)
    with pytest.raises(UnsupportedModelError, match=message):
        check_source(SPARSE.name, SPARSE.served, str(edited), "free")


def test_inference_free_build_serves_both_routes_as_the_library(free_folder, tmp_path):
    """Two model dirs: the routing encoder (TEXT in, the query route's tokenizer and
    weights beside the SPLADE graph) and the ensemble; the serving objects built from
    the rendered config answer encode_query / encode_document, capped too."""
    from sentence_transformers import SparseEncoder

    from generator.families.sparse_encoder import inference_free

    dirs = _build(free_folder, tmp_path, max_active_dims=9)
    assert [d.name for d in dirs] == ["sp_encode", "sp"]
    encode = dirs[0]
    assert set(encode.files) == {"model.onnx", "tokenizer.json", "query_tokenizer.json",
                                 "query_weights.npy"}
    config = parse_config(encode.config)
    assert [i.name for i in config.input] == ["TEXT"]
    assert [o.name for o in config.output] == ["SPARSE_INDICES", "SPARSE_VALUES"]
    router = inference_free._serving_router(encode, tmp_path / "work")
    reference = SparseEncoder(str(free_folder), device="cpu")
    diffs = inference_free.served_parity(reference, router, parity_texts(), 9)
    print(f"\ninference-free parity (k=9): {diffs}")
    assert max(diffs.values()) <= MAX_ABS_DIFF
    assert router.max_active_dims == 9
