"""bench.studies.floor: the empty model that measures the serving floor, and its ensemble."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from bench.manifest import TEXT_MODEL
from bench.studies.floor import FLOOR, add_copy, add_floor, use_code, variant_code, variant_edit
from generator.render import parse_config
from tests.unit import fake_pb_utils as pb
from tests.unit.generator.test_render import GOLDEN  # the rendered configs, as built

MODEL = Path(__file__).parents[4] / "bench" / "studies" / "floor_model" / "model.py"


def _repo(tmp_path: Path) -> Path:
    """A repository with the fused text ensemble and encoder configs, renamed for the bench."""
    for golden, name in (
        ("st_ensemble_fused.pbtxt", TEXT_MODEL),
        ("st_encode_fused.pbtxt", f"{TEXT_MODEL}_encode"),
    ):
        config = parse_config((GOLDEN / golden).read_text())
        text = (GOLDEN / golden).read_text().replace(f'"{config.name}"', f'"{name}"', 1)
        encoder = [s.model_name for s in config.ensemble_scheduling.step]
        for step in encoder:
            text = text.replace(f'"{step}"', f'"{TEXT_MODEL}_encode"')
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.pbtxt").write_text(text)
    return tmp_path


def test_floor_ensemble_is_the_served_one_with_the_empty_encoder(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    add_floor(repo)
    served = parse_config((repo / TEXT_MODEL / "config.pbtxt").read_text())
    floor = parse_config((repo / FLOOR / "config.pbtxt").read_text())
    assert floor.name == FLOOR
    assert [s.model_name for s in floor.ensemble_scheduling.step] == [f"{FLOOR}_encode"]
    assert floor.input == served.input and floor.output == served.output
    encoder = parse_config((repo / f"{TEXT_MODEL}_encode" / "config.pbtxt").read_text())
    empty = parse_config((repo / f"{FLOOR}_encode" / "config.pbtxt").read_text())
    assert empty.name == f"{FLOOR}_encode"
    # Same batching, instances and I/O as the served encoder: only the work differs.
    assert empty.dynamic_batching == encoder.dynamic_batching
    assert empty.instance_group == encoder.instance_group
    assert empty.max_batch_size == encoder.max_batch_size
    assert (repo / f"{FLOOR}_encode" / "1" / "model.py").read_bytes() == MODEL.read_bytes()


def test_a_variant_is_the_served_encoder_with_its_parameters_changed(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    version = repo / f"{TEXT_MODEL}_encode" / "1"
    version.mkdir()
    (version / "model.onnx").write_bytes(b"graph")
    name = f"{TEXT_MODEL}-v1"
    add_copy(repo, name, edit=variant_edit("intra_op_threads=1;allow_spinning=true;count=1"))
    encoder = parse_config((repo / f"{TEXT_MODEL}_encode" / "config.pbtxt").read_text())
    copy = parse_config((repo / f"{name}_encode" / "config.pbtxt").read_text())
    ensemble = parse_config((repo / name / "config.pbtxt").read_text())
    assert [s.model_name for s in ensemble.ensemble_scheduling.step] == [f"{name}_encode"]
    changed = {
        k: v.string_value
        for k, v in copy.parameters.items()
        if v.string_value != encoder.parameters[k].string_value
    }
    assert changed == {"intra_op_threads": "1", "allow_spinning": "true"}
    assert [g.count for g in copy.instance_group] == [1]
    assert [g.count for g in encoder.instance_group] != [1]
    # The graph is linked, not copied: one file on disk, one weight cache entry.
    assert (repo / f"{name}_encode" / "1" / "model.onnx").stat().st_ino == (
        version / "model.onnx"
    ).stat().st_ino


def test_a_variant_naming_an_unknown_parameter_is_refused(tmp_path: Path) -> None:
    config = (_repo(tmp_path) / f"{TEXT_MODEL}_encode" / "config.pbtxt").read_text()
    with pytest.raises(SystemExit, match="no_such_key not found once"):
        variant_edit("no_such_key=1")(config)


def test_a_code_variant_serves_the_stub_code_of_a_revision(tmp_path: Path) -> None:
    assert variant_code("code=HEAD~1;count=1") == "HEAD~1" and variant_code("count=1") == ""
    config = (_repo(tmp_path) / f"{TEXT_MODEL}_encode" / "config.pbtxt").read_text()
    assert variant_edit("code=HEAD")(config) == config  # not a config edit
    version = tmp_path / "copy" / "1"
    (version / "embed_runtime").mkdir(parents=True)
    (version / "embed_runtime" / "stale.py").write_text("")
    use_code(version, "HEAD")
    assert not (version / "embed_runtime" / "stale.py").exists()
    tracked = Path(__file__).parents[4] / "embed_runtime" / "errors.py"
    assert (version / "embed_runtime" / "errors.py").read_text() == tracked.read_text()


def test_empty_model_returns_zero_rows_of_the_encoder_width(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", pb)
    spec = importlib.util.spec_from_file_location("_floor_model", MODEL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model = module.TritonPythonModel()
    config = {"parameters": {"max_dimensions": {"string_value": "384"}}}
    model.initialize({"model_config": json.dumps(config)})
    rows = [np.array([[b"a"]], dtype=object), np.array([[b"b"], [b"c"]], dtype=object)]
    requests = [pb.InferenceRequest([pb.Tensor("TEXT", r)]) for r in rows]
    out = [r.output("EMBEDDING") for r in model.execute(requests)]
    assert [o.shape for o in out] == [(1, 384), (2, 384)]
    assert all(o.dtype == np.float32 and not o.any() for o in out)
