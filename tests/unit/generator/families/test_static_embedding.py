"""StaticEmbedding models (model2vec-style) export with exact parity.

Tiny seeded models (``tests/st_factory.py``: with the MiniLM tokenizer's 128-token
truncation or without any, with a Normalize module or the manifest's ``normalize``) go
through the family's ``build``; the graph and the serving runtime (tokenizer, ragged
merge, sorted chunks) are then compared with ``SentenceTransformer.encode`` of the saved
folder on unicode, single-token and 3,000-token texts.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from embed_runtime.errors import InvalidInputError
from embed_runtime.fused_encoder import TextEncoder
from embed_runtime.ort_encoder import EncoderParams, OrtEncoder
from embed_runtime.tokenizer import BatchTokenizer, TokenizerParams
from generator.families.sentence_transformers import export as family
from generator.families.sentence_transformers import static
from generator.manifest import Manifest, ModelEntry
from generator.render import parse_config
from tests.st_factory import (
    STATIC_VARIANTS,
    StaticVariant,
    build_static_model,
    load_reference,
    manifest_entry,
    reference_embeddings,
    static_texts,
)

MAX_ABS_DIFF = 1e-6  # measured 1.2e-7


@dataclasses.dataclass(frozen=True)
class Exported:
    variant: StaticVariant
    folder: Path
    work: Path
    tokenize_params: dict[str, str]
    encode_params: dict[str, str]
    reference: object
    texts: list[str]
    expected: np.ndarray

    def tokenizer(self) -> BatchTokenizer:
        params = TokenizerParams.from_parameters(self.tokenize_params)
        return BatchTokenizer(str(self.work / "tokenizer.json"), params)


def _parameters(config: str) -> dict[str, str]:
    return {k: v.string_value for k, v in parse_config(config).parameters.items()}


def _build(variant: StaticVariant, folder: Path, work: Path, **fields) -> dict[str, str]:
    entry = ModelEntry(**manifest_entry(variant, folder, **fields))
    work.mkdir(parents=True)
    dirs = family.build(entry, Manifest(models=(entry,), base_dir=folder.parent), work)
    return {d.name: d.config for d in dirs}


@pytest.fixture(scope="module", params=STATIC_VARIANTS, ids=lambda v: v.name)
def exported(request, tmp_path_factory) -> Exported:
    variant = request.param
    base = tmp_path_factory.mktemp(variant.name)
    folder = build_static_model(variant, base / "model")
    configs = _build(variant, folder, base / "work")
    reference = load_reference(folder)
    texts = static_texts()
    return Exported(
        variant,
        folder,
        base / "work",
        _parameters(configs[f"{variant.name}_tokenize"]),
        _parameters(configs[f"{variant.name}_encode"]),
        reference,
        texts,
        reference_embeddings(reference, variant, texts),
    )


def _check(label: str, exported: Exported, got: np.ndarray) -> None:
    assert got.shape == exported.expected.shape == (len(exported.texts), exported.variant.dim)
    diff = float(np.abs(got.astype(np.float64) - exported.expected).max())
    print(f"\n{exported.variant.name} {label}: max|diff| {diff:.2e}")
    assert diff <= MAX_ABS_DIFF


def test_tokens_are_the_modules_own_without_special_tokens(exported):
    tokenizer, module = exported.tokenizer(), exported.reference[0].tokenizer
    for text in exported.texts:
        row = tokenizer.encode([text])
        got = row["input_ids"][0][row["attention_mask"][0] == 1].tolist()
        assert got == module.encode(text, add_special_tokens=False).ids
    longest = tokenizer.encode(["word " * 3000])["input_ids"].shape[1]
    assert longest == (128 if exported.variant.truncate else 3000)


def test_graph_matches_sentence_transformers_with_all_texts_in_one_padded_batch(exported):
    session = ort.InferenceSession(str(exported.work / "model.onnx"))
    got = session.run(["EMBEDDING"], exported.tokenizer().encode(exported.texts))[0]
    _check("one padded batch", exported, got)


def test_graph_matches_sentence_transformers_row_by_row(exported):
    session = ort.InferenceSession(str(exported.work / "model.onnx"))
    tokenizer = exported.tokenizer()
    rows = [session.run(["EMBEDDING"], tokenizer.encode([t]))[0] for t in exported.texts]
    _check("row by row", exported, np.concatenate(rows))


def test_serving_runtime_matches_sentence_transformers(exported):
    """The split pipeline's runtime (ragged merge, sorted chunks) and the fused one."""
    tokenizer = exported.tokenizer()
    params = dataclasses.replace(
        EncoderParams.from_parameters(exported.encode_params), max_rows_per_run=3
    )
    encoder = OrtEncoder(str(exported.work / "model.onnx"), params)
    texts = exported.texts
    requests = [tokenizer.encode(texts[i : i + 5]) for i in range(0, len(texts), 5)]
    _check("serving runtime", exported, np.concatenate(encoder.encode_tokens(requests)))
    fused = TextEncoder(tokenizer, encoder, params)
    reads = [fused.read(np.array([t.encode()], dtype=object), {}) for t in texts]
    fused_rows = [embeddings for embeddings, _ in fused.embed(reads)]
    _check("fused runtime", exported, np.concatenate(fused_rows))


def test_configs_say_no_special_tokens_no_truncation_and_the_tables_bounds(exported):
    tok, enc = exported.tokenize_params, exported.encode_params
    assert (tok["add_special_tokens"], tok["max_length"]) == ("false", "0")
    assert enc["input_names"] == "input_ids,attention_mask"
    assert enc["vocab_size"] == "30522"
    assert enc["max_tokens_per_run"] == str(static.MAX_TOKENS_PER_RUN)
    assert enc.get("max_width") == ("128" if exported.variant.truncate else None)
    assert enc["max_dimensions"] == str(exported.variant.dim)


def test_a_text_without_tokens_is_refused_where_the_library_returns_zeros(exported):
    """A NUL, a lone accent, a zero-width space: the normaliser drops them all."""
    for text in ("\x00", "\u0301", "\u200b"):
        assert not np.any(exported.reference.encode([text]))
        with pytest.raises(InvalidInputError, match="TEXT row 1 has no tokens"):
            exported.tokenizer().encode(["fine", text])


def test_a_manifest_max_seq_length_is_refused(tmp_path):
    variant = STATIC_VARIANTS[0]
    folder = build_static_model(variant, tmp_path / "model")
    with pytest.raises(ValueError, match="max_seq_length does not apply to a StaticEmbedding"):
        _build(variant, folder, tmp_path / "work", max_seq_length=64)


def test_a_static_model_builds_fused(tmp_path):
    variant = STATIC_VARIANTS[1]
    folder = build_static_model(variant, tmp_path / "model")
    configs = _build(variant, folder, tmp_path / "work", fused_tokenize=True)
    assert sorted(configs) == [variant.name, f"{variant.name}_encode"]
    params = _parameters(configs[f"{variant.name}_encode"])
    assert (params["fused_tokenize"], params["add_special_tokens"]) == ("true", "false")
