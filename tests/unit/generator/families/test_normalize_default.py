"""A bare entry serves the model as its own ``encode()``: L2 only where the pipeline has it.

A dot-product model (Transformer + Pooling, no Normalize module) built from an entry that
does not set ``normalize`` must give ``encode()``'s raw vectors, not unit ones; a model
whose pipeline ends in Normalize gives unit vectors; an explicit value overrides; the build
log says which is served and why.
"""

from __future__ import annotations

import numpy as np
import pytest

from generator.families.sentence_transformers.export import resolved_normalize
from generator.manifest import ModelEntry
from tests.st_factory import VARIANTS, build_tiny_model, load_reference, parity, parity_texts
from tests.unit.generator.families.built import build_variant, config_parameters

DOT = next(v for v in VARIANTS if v.pooling == "cls" and not v.normalized)
UNIT = next(v for v in VARIANTS if v.normalize_module)


def _served(variant, tmp_path, **fields) -> tuple[np.ndarray, np.ndarray]:
    """The exported graph's answers to the parity texts, and ``encode()``'s (raw)."""
    import onnxruntime as ort

    folder = build_tiny_model(variant, tmp_path / "model")
    entry_fields = {"normalize": None, **fields}
    dirs = build_variant(variant, folder, tmp_path / "work", **entry_fields)
    reference = load_reference(folder)
    texts = parity_texts()[:12]
    session = ort.InferenceSession(str(tmp_path / "work" / "model.onnx"))
    names = [i.name for i in session.get_inputs()]
    features = reference.preprocess(texts)
    got = session.run(["EMBEDDING"], {n: features[n].numpy() for n in names})[0]
    params = config_parameters(dirs[f"{variant.name}_encode"].config)
    unit = bool(np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5))
    assert params["normalize"] == str(unit).lower()
    return got, reference.encode(texts, convert_to_numpy=True)


def test_a_dot_product_model_with_a_bare_entry_gives_its_raw_vectors(tmp_path):
    got, want = _served(DOT, tmp_path)
    cos, diff = parity(got, want)
    assert diff <= 1e-5 and cos >= 0.999999
    norms = np.linalg.norm(got, axis=1)
    assert np.abs(norms - 1.0).max() > 0.1  # raw: not unit vectors


def test_normalize_true_overrides_a_dot_product_pipeline(tmp_path):
    got, want = _served(DOT, tmp_path, normalize=True)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    want = want / np.linalg.norm(want, axis=1, keepdims=True)
    assert parity(got, want)[1] <= 1e-5


class _Module:
    pass


class Normalize(_Module):
    pass


@pytest.mark.parametrize(
    ("modules", "setting", "served", "why"),
    [
        ([_Module()], None, False, "its pipeline has no Normalize module"),
        ([_Module(), Normalize()], None, True, "its pipeline has a Normalize module"),
        ([_Module()], True, True, "normalize = true in the manifest"),
        ([_Module(), Normalize()], False, False, "normalize = false in the manifest"),
    ],
)
def test_the_build_log_says_what_is_served_and_why(modules, setting, served, why):
    lines: list[str] = []
    entry = ModelEntry(name="m", family="sentence-transformers", source="x", normalize=setting)
    assert resolved_normalize(entry, modules, lines.append).normalize is served
    (line,) = lines
    assert line.startswith(f"m: serves {'L2-normalised' if served else 'raw (not normalised)'}")
    assert why in line


def test_unit_pipeline_still_serves_unit_vectors(tmp_path):
    got, want = _served(UNIT, tmp_path)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    assert parity(got, want)[1] <= 1e-5
