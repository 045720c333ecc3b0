"""``generator.onnx_export``: the spec, the atomic export, parity validation, and warnings
(those of an export reach the caller, bar the named harmless ones)."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from generator import onnx_export  # noqa: E402 - after the torch check
from generator.onnx_export import GraphSpec, TensorSpec, export_module, validate_graph  # noqa: E402

SPEC = GraphSpec((TensorSpec("x", "float32", (3,)),), (TensorSpec("y", "float32", (3,)),))
SAMPLE = {"x": np.ones((2, 3), dtype=np.float32)}
HARMLESS_TRACER = (
    "Converting a tensor to a Python boolean might cause the trace to be incorrect. We can't "
    "record the data flow of Python values, so this value will be treated as a constant."
)


class Warns(torch.nn.Module):
    """Doubles its input; its forward raises the warnings it was given while traced."""

    def __init__(self, *raised: tuple[str, type[Warning]]):
        super().__init__()
        self.raised = raised

    def forward(self, x):
        for message, category in self.raised:
            warnings.warn(message, category, stacklevel=2)
        return x * 2


def _export(module: torch.nn.Module, tmp_path: Path) -> Path:
    path = tmp_path / "m.onnx"
    export_module(module, SPEC, SAMPLE, path)
    assert path.is_file()
    return path


def test_an_unexpected_warning_inside_the_export_reaches_the_caller(tmp_path) -> None:
    module = Warns(("a conversion this project never saw", UserWarning))
    with pytest.warns(UserWarning, match="a conversion this project never saw"):
        _export(module, tmp_path)


def test_a_library_deprecation_inside_the_export_reaches_the_caller(tmp_path) -> None:
    """Python hides deprecations raised outside __main__ by default; the export shows them."""
    module = Warns(("encode_kwargs is deprecated", DeprecationWarning))
    with warnings.catch_warnings(record=True) as seen:
        warnings.resetwarnings()  # Python's own defaults: DeprecationWarning ignored
        warnings.simplefilter("ignore", DeprecationWarning)
        _export(module, tmp_path)
    assert [str(w.message) for w in seen if w.category is DeprecationWarning] == [
        "encode_kwargs is deprecated"
    ]


def test_named_harmless_warnings_are_silenced_and_others_of_the_same_kind_are_not(
    tmp_path,
) -> None:
    module = Warns(
        (HARMLESS_TRACER, torch.jit.TracerWarning),
        ("Iterating over a tensor might cause the trace to be incorrect.", torch.jit.TracerWarning),
    )
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        _export(module, tmp_path)
    messages = [str(w.message) for w in seen]
    assert HARMLESS_TRACER not in messages
    assert "Iterating over a tensor might cause the trace to be incorrect." in messages
    assert not [m for m in messages if "legacy TorchScript-based ONNX export" in m]


def test_a_harmless_message_under_another_category_is_not_silenced(tmp_path) -> None:
    module = Warns((HARMLESS_TRACER, RuntimeWarning))
    with pytest.warns(RuntimeWarning, match="Converting a tensor to a Python boolean"):
        _export(module, tmp_path)


def test_every_named_harmless_warning_has_a_message_and_a_category() -> None:
    for message, category in onnx_export.HARMLESS_EXPORT_WARNINGS:
        assert message
        assert category == "tracer" or issubclass(category, Warning)


class Scaled(torch.nn.Module):
    """``y = x * factor`` over a dynamic number of rows and columns."""

    def __init__(self, factor: float):
        super().__init__()
        self.factor = factor

    def forward(self, x):
        return x * self.factor


DYNAMIC = GraphSpec((TensorSpec("x", "float32", (-1,)),), (TensorSpec("y", "float32", (-1,)),))
CASES = [
    {"x": np.arange(6, dtype=np.float32).reshape(2, 3) + 1},
    {"x": np.linspace(-1, 1, 20, dtype=np.float32).reshape(4, 5)},
]


@pytest.fixture(scope="module")
def doubled(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("export") / "sub" / "doubled.onnx"
    export_module(Scaled(2.0), DYNAMIC, {"x": CASES[0]["x"]}, path)
    return path


def test_tensor_spec_names_its_dynamic_axes_and_triton_type() -> None:
    ids = TensorSpec("input_ids", "int64", (-1,))
    assert ids.dynamic_axes() == {0: "batch", 1: "input_ids_dim1"}
    assert ids.triton_dtype == "TYPE_INT64"
    fixed = TensorSpec("EMBEDDING", "float16", (384,))
    assert fixed.dynamic_axes() == {0: "batch"} and fixed.triton_dtype == "TYPE_FP16"
    spec = GraphSpec((ids, TensorSpec("attention_mask", "int64", (-1,))), (fixed,))
    assert spec.input_names == ["input_ids", "attention_mask"]
    assert spec.output_names == ["EMBEDDING"]


def test_export_writes_the_spec_names_and_dynamic_dims_and_leaves_no_temp_file(doubled) -> None:
    import onnx

    graph = onnx.load(str(doubled)).graph
    assert [i.name for i in graph.input] == ["x"] and [o.name for o in graph.output] == ["y"]
    dims = [d.dim_param for d in graph.input[0].type.tensor_type.shape.dim]
    assert dims == ["batch", "x_dim1"]
    assert doubled.stat().st_mode & 0o777 == 0o644
    assert sorted(p.name for p in doubled.parent.iterdir()) == ["doubled.onnx"]


def test_validate_graph_reports_parity_over_every_case(doubled) -> None:
    report = validate_graph(doubled, DYNAMIC, Scaled(2.0), CASES)
    assert isinstance(report, onnx_export.ParityReport) and report.cases == 2
    assert report.max_abs_diff <= 1e-6 and report.min_cosine > 0.999999


def test_validate_graph_lists_every_case_that_differs_from_pytorch(doubled) -> None:
    with pytest.raises(onnx_export.ExportValidationError) as info:
        validate_graph(doubled, DYNAMIC, Scaled(2.001), CASES)
    assert len(info.value.failures) == 2
    assert info.value.failures[0].startswith("case 0: y max|diff|=")
    assert info.value.failures[1].startswith("case 1: y max|diff|=")
    assert str(doubled) in str(info.value)
    loose = validate_graph(doubled, DYNAMIC, Scaled(2.001), CASES, atol=0.1, min_cosine=0.99)
    assert 1e-3 < loose.max_abs_diff < 0.1


def test_validate_graph_reports_every_name_and_rank_mismatch_before_running(doubled) -> None:
    wrong = GraphSpec(
        (TensorSpec("x", "float32", ()), TensorSpec("mask", "int64", (-1,))),
        (TensorSpec("EMBEDDING", "float32", (-1,)),),
    )

    class Unreachable(torch.nn.Module):
        def forward(self, *args):
            raise AssertionError("PyTorch ran although the graph did not match its spec")

    with pytest.raises(onnx_export.ExportValidationError) as info:
        validate_graph(doubled, wrong, Unreachable(), CASES)
    assert info.value.failures == [
        "input 'x' has rank 2, spec says 1",
        "input 'mask' missing (graph has ['x'])",
        "output 'EMBEDDING' missing (graph has ['y'])",
        "unexpected graph outputs ['y']",
    ]
