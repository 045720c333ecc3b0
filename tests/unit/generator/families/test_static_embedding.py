"""StaticEmbedding models (model2vec-style) export with exact parity.

Tiny seeded models (``tests/st_factory.py``: with the MiniLM tokenizer's 128-token
truncation or without any, with a Normalize module or the manifest's ``normalize``) go
through the family's ``build``; the graph and the serving runtime (tokenizer, ragged
merge, sorted chunks) are then compared with ``SentenceTransformer.encode`` of the saved
folder on unicode, single-token and 3,000-token texts.
"""

from __future__ import annotations

import numpy as np
import pytest

from embed_runtime.engines.text_encoder import TextEncoder
from embed_runtime.errors import InvalidInputError
from generator.families.sentence_transformers import static
from tests.st_factory import STATIC_VARIANTS, build_static_model, static_texts
from tests.unit.generator.families.built import (
    ExportedVariant,
    build_variant,
    config_parameters,
    export_variant,
)

MAX_ABS_DIFF = 1e-6  # measured 1.2e-7


@pytest.fixture(scope="module", params=STATIC_VARIANTS, ids=lambda v: v.name)
def exported(request, tmp_path_factory) -> ExportedVariant:
    variant = request.param
    base = tmp_path_factory.mktemp(variant.name)
    folder = build_static_model(variant, base / "model")
    return export_variant(variant, folder, base / "work", static_texts())


def _check(label: str, exported: ExportedVariant, got: np.ndarray) -> None:
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
    got = exported.session.run(["EMBEDDING"], exported.tokenizer().encode(exported.texts))[0]
    _check("one padded batch", exported, got)


def test_graph_matches_sentence_transformers_row_by_row(exported):
    tokenizer = exported.tokenizer()
    rows = [exported.session.run(["EMBEDDING"], tokenizer.encode([t]))[0] for t in exported.texts]
    _check("row by row", exported, np.concatenate(rows))


def test_serving_runtime_matches_sentence_transformers(exported):
    """The split pipeline's runtime (ragged merge, sorted chunks) and the fused one."""
    encoder = exported.serving_encoder()
    _check("serving runtime", exported, exported.served(encoder))
    fused = TextEncoder(exported.tokenizer(), encoder, encoder.params)
    reads = [fused.read(np.array([t.encode()], dtype=object), {}) for t in exported.texts]
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
        build_variant(variant, folder, tmp_path / "work", max_seq_length=64)


def test_a_static_model_builds_fused(tmp_path):
    variant = STATIC_VARIANTS[1]
    folder = build_static_model(variant, tmp_path / "model")
    dirs = build_variant(variant, folder, tmp_path / "work", fused_tokenize=True)
    assert sorted(dirs) == [variant.name, f"{variant.name}_chunks", f"{variant.name}_encode"]
    params = config_parameters(dirs[f"{variant.name}_encode"].config)
    assert (params["fused_tokenize"], params["add_special_tokens"]) == ("true", "false")
