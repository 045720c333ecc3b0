"""Warnings of an ONNX export reach the caller, bar the named harmless ones."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from generator.onnx_export import (  # noqa: E402 - after the torch check
    HARMLESS_EXPORT_WARNINGS,
    GraphSpec,
    TensorSpec,
    export_module,
)

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
    for message, category in HARMLESS_EXPORT_WARNINGS:
        assert message
        assert category == "tracer" or issubclass(category, Warning)
