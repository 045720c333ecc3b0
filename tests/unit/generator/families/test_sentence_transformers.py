"""Each pooling mode and head of a sentence-transformers model exports with exact parity.

Tiny random-initialised models (``tests/st_factory.py``) cover mean, CLS, max,
last-token and weighted-mean pooling, a Dense head and both ways of normalising. The
family's ``build`` exports each; the graph is then compared with
``SentenceTransformer.encode`` of the saved folder (an independent load), on texts of
very different lengths run together (padding) and alone.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from generator.render import parse_config
from tests.st_factory import VARIANTS, build_tiny_model, load_reference, parity, parity_texts
from tests.unit.generator.families.built import (
    ExportedVariant,
    build_variant,
    config_parameters,
    export_variant,
)

MIN_COSINE = 0.999999
MAX_ABS_DIFF = 1e-5
ALL_FORMS = ("float16", "int8", "uint8", "binary", "ubinary")


@pytest.fixture(scope="module", params=VARIANTS, ids=lambda v: v.name)
def exported(request, tmp_path_factory) -> ExportedVariant:
    variant = request.param
    base = tmp_path_factory.mktemp(variant.name)
    folder = build_tiny_model(variant, base / "model")
    return export_variant(
        variant, folder, base / "work", parity_texts(), output_precisions=ALL_FORMS
    )


def _reference_tokens(exported: ExportedVariant, texts: list[str]) -> dict[str, np.ndarray]:
    """Token tensors from sentence-transformers' own tokenizer, padded to the longest."""
    names = [i.name for i in exported.session.get_inputs()]
    features = exported.reference.preprocess(texts)
    return {n: features[n].numpy().astype(np.int64) for n in names}


def _check(label: str, exported: ExportedVariant, got: np.ndarray) -> None:
    assert got.shape == exported.expected.shape
    cos, diff = parity(got, exported.expected)
    print(f"\n{exported.variant.name} {label}: min cos {cos:.9f}, max|diff| {diff:.2e}")
    assert cos >= MIN_COSINE
    assert diff <= MAX_ABS_DIFF


def test_saved_model_declares_its_pooling_mode_and_head(exported):
    """The factory's folder carries the config the export has to read."""
    variant, folder = exported.variant, exported.folder
    modules = [
        m["type"].rsplit(".", 1)[-1] for m in json.loads((folder / "modules.json").read_text())
    ]
    expected = ["Transformer", "Pooling"]
    expected += ["Dense"] * variant.dense + ["Normalize"] * variant.normalize_module
    assert modules == expected
    pooling = json.loads((folder / "1_Pooling" / "config.json").read_text())
    assert pooling["pooling_mode"] == variant.pooling


def test_graph_matches_sentence_transformers_with_all_texts_in_one_padded_batch(exported):
    """Short rows padded to the longest (64 tokens) must pool only their real tokens."""
    inputs = _reference_tokens(exported, exported.texts)
    lengths = inputs["attention_mask"].sum(axis=1)
    assert lengths.min() <= 3 and lengths.max() == inputs["attention_mask"].shape[1] == 64
    got = exported.session.run(["EMBEDDING"], inputs)[0]
    _check("one padded batch", exported, got)


def test_graph_matches_sentence_transformers_row_by_row(exported):
    session = exported.session
    rows = [
        session.run(["EMBEDDING"], _reference_tokens(exported, [text]))[0]
        for text in exported.texts
    ]
    _check("row by row", exported, np.concatenate(rows))


def test_serving_runtime_matches_sentence_transformers(exported):
    """The served path without Triton: runtime tokenizer, ragged merge, sorted chunks."""
    _check("serving runtime", exported, exported.served(exported.serving_encoder()))


def test_embedding_width_and_normalisation_follow_the_pipeline(exported):
    variant = exported.variant
    encode_config = parse_config(exported.encode_config)
    # The Python runner may truncate (``dimensions``): output [-1], the width a parameter;
    # it also answers the quantized forms the entry names (output precision).
    outputs = [(o.name, list(o.dims)) for o in encode_config.output]
    forms = ["FP16", "INT8", "UINT8", "BINARY", "UBINARY"]
    assert outputs == [("EMBEDDING", [-1]), *((f"EMBEDDING_{f}", [-1]) for f in forms)]
    assert encode_config.parameters["max_dimensions"].string_value == str(variant.dim)
    inputs = _reference_tokens(exported, exported.texts[:8])
    got = exported.session.run(["EMBEDDING"], inputs)[0]
    assert got.shape == (8, variant.dim)
    norms = np.linalg.norm(got, axis=1)
    if variant.normalized:
        np.testing.assert_allclose(norms, 1.0, atol=1e-5)
    else:
        assert np.abs(norms - 1.0).min() > 1e-2, "raw pooled vectors are not unit length"


def test_build_refuses_a_model_whose_output_depends_on_padding_the_server_does_not_do(
    tmp_path,
) -> None:
    """Negative control of the served-padding check: a BERT (absolute positions) whose
    tokenizer pads on the left gives the library other vectors for short texts in a batch
    than the server, which pads every chunk on the right; the build must refuse it."""
    variant = next(v for v in VARIANTS if v.pooling == "mean")
    folder = build_tiny_model(variant, tmp_path / "model")
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["padding_side"] = "left"
    config_path.write_text(json.dumps(config))
    assert load_reference(folder).tokenizer.padding_side == "left"
    with pytest.raises(RuntimeError, match="depends on padding the server does not reproduce"):
        build_variant(variant, folder, tmp_path / "work")


def test_build_stores_calibration_rows_of_the_shipped_corpus_run_through_the_graph(exported):
    from generator.calibration import CALIBRATION_FILE, DEFAULT_CORPUS, read_corpus

    calib = np.load(exported.work / CALIBRATION_FILE)
    corpus = read_corpus(DEFAULT_CORPUS)
    assert calib.shape == (len(corpus), exported.variant.dim) and calib.dtype == np.float32
    picks = [0, 100, len(corpus) - 1]
    alone = [
        exported.session.run(["EMBEDDING"], _reference_tokens(exported, [corpus[i]]))[0][0]
        for i in picks
    ]
    np.testing.assert_allclose(calib[picks], np.stack(alone), atol=1e-5)
    assert (calib.min(axis=0) < calib.max(axis=0)).all()  # a real range in every dimension


def test_native_backend_models_refuse_other_precisions_in_their_tokenize_step(tmp_path):
    """Triton's onnxruntime backend answers EMBEDDING alone, so the tokenize step is told to
    refuse a ``precision`` parameter; python-ort models leave that to their encoder."""
    variant = VARIANTS[0]
    folder = build_tiny_model(variant, tmp_path / "model")
    for backend, flagged in (("onnxruntime", True), ("python-ort", False)):
        dirs = build_variant(variant, folder, tmp_path / backend, encoder_backend=backend)
        tokenize = dirs[f"{variant.name}_tokenize"]
        flag = config_parameters(tokenize.config).get("float32_only")
        assert flag == ("true" if flagged else None), backend


def test_extra_outputs_are_declared_only_when_the_entry_names_them(tmp_path):
    """By default EMBEDDING alone, so a plain JSON request, which gets every output, gets
    the embedding and nothing else; token_count = true adds TOKEN_COUNT, output_precisions
    = ["ubinary"] adds that form, with no calibration file (only int8 / uint8 need ranges)."""
    variant = VARIANTS[0]
    folder = build_tiny_model(variant, tmp_path / "model")
    cases = (
        ({}, []),
        ({"token_count": True}, ["TOKEN_COUNT"]),
        ({"output_precisions": ("ubinary",)}, ["EMBEDDING_UBINARY"]),
    )
    for i, (fields, outputs) in enumerate(cases):
        dirs = build_variant(variant, folder, tmp_path / f"work{i}", **fields)
        encode = dirs[f"{variant.name}_encode"]
        names = [o.name for o in parse_config(encode.config).output]
        assert names == ["EMBEDDING", *outputs]
        ensemble = [o.name for o in parse_config(dirs[variant.name].config).output]
        assert ensemble == ["EMBEDDING", *outputs]
        assert "calibration_embeddings.npy" not in encode.files
