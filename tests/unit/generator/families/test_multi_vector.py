"""The multi-vector family: declaration, refusals, manifest checks and export parity.

Tiny random ColBERT models (``generator/fixtures/tiny_colbert.py``) in three shapes:
fixed query expansion not attended with a punctuation skiplist (classic ColBERT),
``min`` expansion attended without a skiplist, and no expansion without Normalize. Each
is built by the family's ``build``; the serving code (``embed_runtime.engines.multivector``,
one execution holding query and document requests) runs the exported graph, and every
row is compared with ``encode_query`` / ``encode_document`` of an independent load.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pytest

from client.multivector import maxsim
from embed_runtime.engines.multivector import MultiVectorRequest, unpad
from embed_runtime.errors import InvalidInputError
from generator.declared_kind import UnsupportedModelError, check_source
from generator.families import FAMILIES
from generator.families.multi_vector import export as family
from generator.fixtures.tiny_colbert import PROMPTS, QUERY_LENGTH, create_tiny_colbert
from generator.lifecycle import parse_request
from generator.manifest import ManifestError, parse_manifest
from generator.render import parse_config
from tests.st_factory import parity_texts

MAX_ABS_DIFF = 1e-5
MULTI = FAMILIES["multi-vector"]
SHAPES = {
    "classic": {},
    "min-attend": {"expansion": "min", "attend": True, "skiplist": False},
    "plain": {"expansion": None, "normalize": False},
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    """The three tiny ColBERT folders of :data:`SHAPES`."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    root = tmp_path_factory.mktemp("colbert")
    return {
        name: create_tiny_colbert(root / name, seed=i + 1, **kwargs)
        for i, (name, kwargs) in enumerate(SHAPES.items())
    }


def _build(folder: Path, work: Path, **fields):
    manifest = parse_manifest(
        {"models": [{"name": "cb", "family": "multi-vector", "source": str(folder),
                     "max_rows_per_run": 4, **fields}]}, work)
    return family.build(manifest.models[0], manifest, work / "work")


def _served(dirs, requests: list[MultiVectorRequest]):
    encode, _ = dirs
    served = family._serving_encoder(encode, encode.files["model.onnx"],
                                     encode.files["tokenizer.json"])
    return served.embed(requests)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_served_rows_equal_encode_query_and_encode_document(folders, tmp_path, shape) -> None:
    from sentence_transformers import MultiVectorEncoder

    dirs = _build(folders[shape], tmp_path)
    texts = parity_texts()
    half = len(texts) // 2
    q, d = PROMPTS["query"], PROMPTS["document"]
    requests = [  # one execution: documents, queries, documents again (prompts applied)
        MultiVectorRequest([d + t for t in texts[:half]], "document"),
        MultiVectorRequest([q + t for t in texts], "query"),
        MultiVectorRequest([d + t for t in texts[half:]], "document"),
    ]
    answers = _served(dirs, requests)
    reference = MultiVectorEncoder(str(folders[shape]), device="cpu")
    queries = [q.numpy() for q in reference.encode_query(texts, batch_size=8)]
    documents = [d.numpy() for d in reference.encode_document(texts, batch_size=8)]
    got_docs = unpad(*answers[0]) + unpad(*answers[2])
    got_queries = unpad(*answers[1])
    worst = 0.0
    for got, want in ((got_queries, queries), (got_docs, documents)):
        for g, w in zip(got, want, strict=True):
            assert g.shape == w.shape
            worst = max(worst, float(np.abs(g - w).max()))
    for embeddings, counts in answers:
        assert embeddings.shape[1] == counts.max()  # each request padded to its own longest
        assert embeddings.dtype == np.float32 and counts.dtype == np.int32
    lengths = sorted({len(q) for q in queries}), sorted({len(d) for d in documents})
    print(f"\n{shape}: max|diff| {worst:.2e}, query vectors {lengths[0]}, documents "
          f"{lengths[1][0]}-{lengths[1][-1]}")
    assert worst <= MAX_ABS_DIFF
    if shape == "classic":
        assert lengths[0] == [QUERY_LENGTH]
    scores = maxsim(got_queries, got_docs)
    want_scores = reference.similarity(queries, documents).numpy()
    assert np.abs(scores - want_scores).max() <= 1e-4
    assert (scores.argmax(1) == want_scores.argmax(1)).all()


def test_rendered_configs_declare_embeddings_and_token_count(folders, tmp_path) -> None:
    dirs = _build(folders["classic"], tmp_path)
    assert [d.name for d in dirs] == ["cb_encode", "cb"]
    for model_dir in dirs:
        outputs = {o.name: (o.data_type, list(o.dims))
                   for o in parse_config(model_dir.config).output}
        assert outputs == {"EMBEDDINGS": (11, [-1, 16]), "TOKEN_COUNT": (8, [1])}
    assert dirs[0].adapter == "encode_multivector"


def test_request_parameters_are_checked_per_request(folders, tmp_path) -> None:
    encode, _ = _build(folders["classic"], tmp_path)
    served = family._serving_encoder(encode, encode.files["model.onnx"],
                                     encode.files["tokenizer.json"])
    rows = np.array([[b"a cat"]], dtype=object)
    assert served.read(rows, {}).task == "document"
    assert served.read(rows, {"task": "query"}).texts == ["[Q] a cat"]
    with pytest.raises(InvalidInputError, match="task must be one of"):
        served.read(rows, {"task": "passage"})
    with pytest.raises(InvalidInputError, match="does not support dimensions"):
        served.read(rows, {"dimensions": 8})
    with pytest.raises(InvalidInputError, match="empty or whitespace"):
        served.read(np.array([[b"  "]], dtype=object), {})


def test_a_multi_vector_folder_is_served_here_and_pointed_to_by_the_others(folders) -> None:
    check_source(MULTI.name, MULTI.served, str(folders["classic"]), "m")
    MULTI.check_folder(folders["classic"])
    for other in ("sentence-transformers", "sparse-encoder", "cross-encoder"):
        with pytest.raises(UnsupportedModelError, match=re.escape("(use family 'multi-vector')")):
            check_source(other, FAMILIES[other].served, str(folders["classic"]), "m")


def _folder(root: Path, modules: list[str], config: dict) -> Path:
    root.mkdir(parents=True)
    entries = [{"idx": i, "name": str(i), "path": "" if i == 0 else f"{i}_x", "type": t}
               for i, t in enumerate(modules)]
    (root / "modules.json").write_text(json.dumps(entries))
    (root / "config_sentence_transformers.json").write_text(json.dumps(config))
    return root


def test_pylate_folders_are_read_as_pylate_and_other_pipelines_refused_by_name(
    tmp_path,
) -> None:
    from tests.st_factory import tokenizer_dir

    transformer, dense = "sentence_transformers.models.Transformer", "pylate.models.Dense.Dense"
    pylate = _folder(tmp_path / "pylate", [transformer, dense, dense],
                     {"query_prefix": "[unused0]", "document_prefix": "[unused1]",
                      "query_length": 32, "attend_to_expansion_tokens": False})
    assert check_source(MULTI.name, MULTI.served, str(pylate), "p").model_type == (
        "PyLate ColBERT")
    v3 = _folder(tmp_path / "v3", [transformer, dense], {"model_type": "ColBERT"})
    assert check_source(MULTI.name, MULTI.served, str(v3), "p").model_type == "PyLate ColBERT"
    for name, modules, what in (
        ("extra", [transformer, dense, "sentence_transformers.models.Normalize"],
         "module 'sentence_transformers.models.Normalize'"),
        ("custom", ["my_package.Encoder", dense], "module 'my_package.Encoder'"),
        ("alone", [transformer], "a pipeline without a PyLate Dense"),
    ):
        folder = _folder(tmp_path / name, modules, {"model_type": "ColBERT"})
        with pytest.raises(UnsupportedModelError, match=f"{what} is not supported in a PyLate"):
            check_source(MULTI.name, MULTI.served, str(folder), "p")
    with pytest.raises(UnsupportedModelError, match="use family 'multi-vector'"):
        dense_family = FAMILIES["sentence-transformers"]
        check_source(dense_family.name, dense_family.served, str(pylate), "p")
    bare = tmp_path / "bare"  # a transformers folder: the library would add a random projection
    bare.mkdir()
    (bare / "config.json").write_text("{}")
    with pytest.raises(UnsupportedModelError, match="declares no model_type"):
        check_source(MULTI.name, MULTI.served, str(bare), "b")
    with pytest.raises(UnsupportedModelError, match="declares no model_type"):
        check_source(MULTI.name, MULTI.served, str(tokenizer_dir()), "mini")
    pooled = _folder(tmp_path / "pooled", [
        transformer, "sentence_transformers.base.modules.dense.Dense",
        "sentence_transformers.multi_vector_encoder.modules.token_pooling."
        "HierarchicalTokenPooling"], {"model_type": "MultiVectorEncoder"})
    with pytest.raises(UnsupportedModelError, match="HierarchicalTokenPooling' \\(token pooling"):
        check_source(MULTI.name, MULTI.served, str(pooled), "t")


def test_the_build_refuses_a_pipeline_it_does_not_reproduce(tmp_path) -> None:
    """A library-saved MultiVectorEncoder whose Dense acts on sentence embeddings, no mask."""
    from sentence_transformers import MultiVectorEncoder
    from sentence_transformers.base.modules import Dense, Transformer
    from transformers import BertConfig, BertModel

    from tests.st_factory import tokenizer_dir

    base = tmp_path / "bert"
    BertModel(BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=1,
                         num_attention_heads=2, intermediate_size=37)).save_pretrained(base)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt",
                 "special_tokens_map.json"):
        if (tokenizer_dir() / name).exists():
            (base / name).write_bytes((tokenizer_dir() / name).read_bytes())
    folder = tmp_path / "odd"
    MultiVectorEncoder(modules=[Transformer(str(base)), Dense(32, 8)]).save(str(folder))
    with pytest.raises(UnsupportedModelError, match=re.escape(
            "Dense on ['sentence_embedding'] (only token_embeddings is served); "
            "0 MultiVectorMask modules (needs one)")):
        _build(folder, tmp_path / "b")
    assert not (tmp_path / "b" / "work" / "model.onnx").exists()


def test_manifest_checks_of_the_family(tmp_path) -> None:
    with pytest.raises(ManifestError) as exc:
        parse_manifest({"models": [
            {"name": "a", "family": "multi-vector", "source": "x",
             "encoder_backend": "onnxruntime"},
            {"name": "b", "family": "multi-vector", "source": "x", "precision": "int8"},
            {"name": "c", "family": "multi-vector", "source": "x", "max_active_dims": 8},
        ]}, tmp_path)
    text = str(exc.value)
    assert "(a): multi-vector needs encoder_backend 'python-ort'" in text
    assert "(b): multi-vector models are served in precision 'fp32' only" in text
    assert "(c): max_active_dims needs family 'sparse-encoder'" in text
    entry = parse_manifest({"models": [{"name": "cb", "family": "multi-vector",
                                        "source": "x"}]}, tmp_path).models[0]
    assert entry.model_dirs == ("cb", "cb_encode")


def test_model_manager_checks_a_colbert_folder_by_this_family(folders, tmp_path) -> None:
    from generator.manifest import ManagerSettings
    from tests.unit.generator.test_lifecycle import _load, _manager

    folder = folders["classic"]
    manager = _manager(tmp_path / "srv", roots=[folder.parent])
    settings = ManagerSettings(allowed_roots=(str(folder.parent),))
    request = parse_request(json.dumps({"action": "load", "family": "multi-vector",
                                        "source": str(folder), "name": "cb"}))
    assert manager._source_fields(request, settings)["source"] == str(folder)
    with pytest.raises(InvalidInputError, match="use family 'multi-vector'"):
        manager.handle(_load(str(folder), "cb"))


def test_a_pylate_folder_is_refused_without_its_pinned_reference(tmp_path, monkeypatch) -> None:
    from generator import pylate_reference

    folder = _folder(tmp_path / "pylate", ["sentence_transformers.models.Transformer",
                                           "pylate.models.Dense.Dense"], {"model_type": "ColBERT"})
    empty = tmp_path / "no-reference"
    empty.mkdir()
    monkeypatch.setenv(pylate_reference.ENV, str(empty))
    manifest = parse_manifest({"models": [{"name": "p", "family": "multi-vector",
                                           "source": str(folder)}]}, tmp_path)
    with pytest.raises(UnsupportedModelError, match=r"built only against PyLate's own encode.*"
                       r"found nothing.*make pylate-reference"):
        family.build(manifest.models[0], manifest, tmp_path / "work")
    (empty / "pylate-1.5.2.dist-info").mkdir()
    with pytest.raises(UnsupportedModelError, match="found PyLate 1.5.2"):
        family.build(manifest.models[0], manifest, tmp_path / "work")


def test_pylate_settings_refuse_prompts_odd_lengths_and_foreign_activations(tmp_path) -> None:
    from generator.families.multi_vector import pylate

    def settings(config: dict) -> dict:
        folder = tmp_path / str(len(list(tmp_path.iterdir())))
        folder.mkdir()
        (folder / "config_sentence_transformers.json").write_text(json.dumps(config))
        return pylate.settings_of(folder, "p")

    got = settings({"prompts": {"query": "", "document": ""}, "query_length": 20})
    assert got["query_length"] == 20 and got["document_length"] == 180
    assert got["query_prefix"] == "[Q] " and got["do_query_expansion"] is True
    assert "," in got["skiplist_words"]
    with pytest.raises(UnsupportedModelError, match="prompts"):
        settings({"prompts": {"query": "search_query: "}})
    with pytest.raises(UnsupportedModelError, match="query_length 1"):
        settings({"query_length": 1})
    with pytest.raises(UnsupportedModelError, match="activation 'os.system'"):
        pylate._activation("p", "os.system")
    assert type(pylate._activation("p", "torch.nn.modules.activation.Tanh")).__name__ == "Tanh"
