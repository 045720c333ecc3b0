"""Export a PyTorch module to ONNX from a declared graph spec, then check it against PyTorch.

One :class:`GraphSpec` drives the export (input/output names, dynamic axes, opset) and
the rendered ``config.pbtxt`` dims, so the names in the graph and in the config cannot
drift apart.
"""

from __future__ import annotations

import os
import sys
import tempfile
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

DEFAULT_OPSET = 17

TRITON_DTYPES = {"int64": "TYPE_INT64", "float32": "TYPE_FP32", "float16": "TYPE_FP16"}


@dataclass(frozen=True)
class TensorSpec:
    """One named graph tensor; ``dims`` exclude the batch dim, ``-1`` marks a dynamic dim."""

    name: str
    dtype: str
    dims: tuple[int, ...]

    @property
    def triton_dtype(self) -> str:
        """The ``TYPE_*`` name used in ``config.pbtxt``."""
        return TRITON_DTYPES[self.dtype]

    def dynamic_axes(self) -> dict[int, str]:
        """ONNX dynamic axes: the batch dim plus every ``-1`` dim."""
        axes = {0: "batch"}
        for i, dim in enumerate(self.dims, start=1):
            if dim == -1:
                axes[i] = f"{self.name}_dim{i}"
        return axes


@dataclass(frozen=True)
class GraphSpec:
    """Inputs and outputs of one exported graph."""

    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    opset: int = DEFAULT_OPSET

    @property
    def input_names(self) -> list[str]:
        """Input names in positional order."""
        return [t.name for t in self.inputs]

    @property
    def output_names(self) -> list[str]:
        """Output names in order."""
        return [t.name for t in self.outputs]


class ExportValidationError(RuntimeError):
    """The exported graph disagrees with its spec or with PyTorch; lists every failure."""

    def __init__(self, path: Path, failures: Sequence[str]):
        self.failures = list(failures)
        super().__init__(f"ONNX validation of {path} failed:\n  " + "\n  ".join(failures))


@dataclass(frozen=True)
class ParityReport:
    """How close ONNX Runtime came to PyTorch over the validation cases."""

    cases: int
    max_abs_diff: float
    min_cosine: float


# Warnings every export of the encoders served here raises, each harmless for the reason
# beside it: (message regex, category; "tracer" stands for torch.jit.TracerWarning).
# Every other warning of an export reaches the build log.
HARMLESS_EXPORT_WARNINGS: tuple[tuple[str, type[Warning] | str], ...] = (
    # We pick the TorchScript exporter on purpose (dynamo=False); a torch without it fails
    # the export itself, loudly.
    (r"You are using the legacy TorchScript-based ONNX export", DeprecationWarning),
    # That exporter's own internals, deprecated with it.
    (r"The feature will be removed\. Please remove usage of this function", DeprecationWarning),
    # Python-level branches of transformers' mask and attention code (shape checks) fixed at
    # trace time: the parity check runs other lengths, batch sizes and padding through ONNX
    # Runtime against PyTorch, so a trace that took a wrong branch fails the build.
    (r"Converting a tensor to a Python (boolean|integer|float|index|number)", "tracer"),
    (r"torch\.tensor results are registered as constants in the trace", "tracer"),
    # Advanced indexing (attention masks) becomes Gather; it would go wrong only on negative
    # indices, which the parity check's cases would show.
    (r"Exporting aten::index operator of advanced indexing", UserWarning),
)


def _filter_export_warnings(tracer_warning: type[Warning]) -> None:
    """Inside ``catch_warnings``: let warnings through, bar :data:`HARMLESS_EXPORT_WARNINGS`.

    Deprecations are shown too (Python hides those raised outside ``__main__``), unless the
    user chose filters of their own (``-W``, ``PYTHONWARNINGS``).
    """
    if not sys.warnoptions:
        warnings.simplefilter("default")
    for message, category in HARMLESS_EXPORT_WARNINGS:
        cls = tracer_warning if category == "tracer" else category
        warnings.filterwarnings("ignore", message=message, category=cls)


def export_module(module, spec: GraphSpec, sample: dict[str, object], path: Path) -> None:
    """Export ``module`` (called with the inputs positionally) to ``path`` atomically.

    ``sample`` maps input names to tensors or numpy arrays.
    """
    import torch  # noqa: PLC0415 - generator-only dependency

    path.parent.mkdir(parents=True, exist_ok=True)
    args = tuple(torch.as_tensor(sample[name]) for name in spec.input_names)
    dynamic_axes = {t.name: t.dynamic_axes() for t in (*spec.inputs, *spec.outputs)}
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, suffix=".onnx.tmp")
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        with torch.no_grad(), warnings.catch_warnings():
            _filter_export_warnings(torch.jit.TracerWarning)
            torch.onnx.export(
                module.eval(),
                args,
                str(tmp),
                input_names=spec.input_names,
                output_names=spec.output_names,
                dynamic_axes=dynamic_axes,
                opset_version=spec.opset,
                do_constant_folding=True,
                dynamo=False,
            )
        tmp.chmod(0o644)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)


def _cosine_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = a.reshape(a.shape[0], -1).astype(np.float64)
    b = b.reshape(b.shape[0], -1).astype(np.float64)
    denom = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    return np.sum(a * b, axis=1) / np.maximum(denom, 1e-12)


def validate_graph(
    path: Path,
    spec: GraphSpec,
    module,
    cases: Sequence[dict[str, np.ndarray]],
    atol: float = 1e-4,
    min_cosine: float = 0.9999,
    providers: Sequence[str] | None = None,
    basic_optimization: bool = False,
) -> ParityReport:
    """Check names, ranks and dtypes of the graph, then ORT vs PyTorch on every case.

    ``providers`` defaults to ONNX Runtime's CPU provider; ``basic_optimization`` limits
    ONNX Runtime to its basic graph rewrites (for graphs its CPU fusions cannot take).

    All failures are collected and raised together as :class:`ExportValidationError`.
    """
    import onnx  # noqa: PLC0415
    import onnxruntime as ort  # noqa: PLC0415
    import torch  # noqa: PLC0415

    failures: list[str] = []
    model = onnx.load(str(path))
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as exc:
        failures.append(f"onnx checker: {exc}")
    graph_inputs = {i.name: i for i in model.graph.input}
    graph_outputs = {o.name: o for o in model.graph.output}
    for kind, tensors, found in (
        ("input", spec.inputs, graph_inputs),
        ("output", spec.outputs, graph_outputs),
    ):
        for t in tensors:
            if t.name not in found:
                failures.append(f"{kind} {t.name!r} missing (graph has {sorted(found)})")
                continue
            rank = len(found[t.name].type.tensor_type.shape.dim)
            if rank != len(t.dims) + 1:
                failures.append(f"{kind} {t.name!r} has rank {rank}, spec says {len(t.dims) + 1}")
    extra = set(graph_outputs) - set(spec.output_names)
    if extra:
        failures.append(f"unexpected graph outputs {sorted(extra)}")
    if failures:
        raise ExportValidationError(path, failures)

    options = ort.SessionOptions()
    if basic_optimization:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    session = ort.InferenceSession(
        str(path), sess_options=options, providers=providers or ["CPUExecutionProvider"]
    )
    max_abs, min_cos = 0.0, 1.0
    for n, case in enumerate(cases):
        with torch.no_grad():
            expected = module(*(torch.from_numpy(case[name]) for name in spec.input_names))
        expected = [expected] if isinstance(expected, torch.Tensor) else list(expected)
        got = session.run(spec.output_names, {name: case[name] for name in spec.input_names})
        for out_spec, want, have in zip(spec.outputs, expected, got, strict=True):
            want = want.detach().cpu().numpy()
            if want.shape != have.shape:
                failures.append(f"case {n}: {out_spec.name} shape {have.shape} != {want.shape}")
                continue
            diff = float(np.max(np.abs(want - have))) if want.size else 0.0
            cos = float(np.min(_cosine_rows(want, have))) if want.size else 1.0
            max_abs, min_cos = max(max_abs, diff), min(min_cos, cos)
            if diff > atol or cos < min_cosine:
                failures.append(
                    f"case {n}: {out_spec.name} max|diff|={diff:.2e} (atol {atol:.0e}), "
                    f"min cosine={cos:.6f} (min {min_cosine})"
                )
    if failures:
        raise ExportValidationError(path, failures)
    return ParityReport(cases=len(cases), max_abs_diff=max_abs, min_cosine=min_cos)
