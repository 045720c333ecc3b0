"""bench.studies.floor: the empty model that measures the serving floor, and its ensemble."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np

from bench.manifest import TEXT_MODEL
from bench.studies.floor import FLOOR, add_floor
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
