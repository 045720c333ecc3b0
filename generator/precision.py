"""Precision knobs of an exported encoder: fp32 as exported, int8 or fp16 derived from it.

* ``int8``: ONNX Runtime dynamic quantisation of the weights of ``MatMul`` (and
  ``Gemm`` / ``Conv`` in image towers) to signed 8-bit, activations quantised per batch
  at run time. Meant for CPUs; the graph keeps float32 inputs and outputs.
* ``fp16``: every float initializer and op in half precision, with float32 inputs and
  outputs kept (casts at the edges). Meant for GPUs (CUDA / TensorRT execution
  providers); the manifest allows it on ``device = "gpu"`` only, though the check below
  also runs on ONNX Runtime's CPU provider.

A derived graph is checked against the PyTorch module like the fp32 one, with the
looser tolerances of :data:`PARITY`; the fp32 graph is always validated first.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .onnx_export import ExportValidationError, GraphSpec, ParityReport, validate_graph

# Tolerances of the derived graph vs PyTorch fp32: (max |diff| per element, min cosine).
PARITY: dict[str, tuple[float, float]] = {
    "fp32": (1e-4, 0.9999),
    "fp16": (2e-2, 0.999),
    "int8": (1.0, 0.95),
}
INT8_OPS = ("MatMul", "Gemm", "Conv")


def _atomic_write(path: Path, write) -> None:
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, suffix=".onnx.tmp")
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        write(tmp)
        tmp.chmod(0o644)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)


def weight_nodes(model) -> list[str]:
    """Names of the :data:`INT8_OPS` nodes that multiply by a constant weight."""
    constants = {t.name for t in model.graph.initializer}
    return [
        node.name
        for node in model.graph.node
        if node.op_type in INT8_OPS and any(name in constants for name in node.input[1:])
    ]


def quantize_int8(src: Path, dst: Path) -> None:
    """Dynamic int8 quantisation of the weights of ``src`` (QInt8 per channel) into ``dst``.

    Only products with a constant weight are quantised; activation x activation
    products (attention scores) stay float.
    """
    import onnx  # noqa: PLC0415
    from onnxruntime.quantization import QuantType, quantize_dynamic  # noqa: PLC0415

    nodes = weight_nodes(onnx.load(str(src), load_external_data=False))

    def write(tmp: Path) -> None:
        quantize_dynamic(
            str(src),
            str(tmp),
            weight_type=QuantType.QInt8,
            per_channel=True,
            op_types_to_quantize=list(INT8_OPS),
            nodes_to_quantize=nodes,
            extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
        )

    _atomic_write(dst, write)


def sort_nodes(graph) -> None:
    """Put ``graph``'s nodes in topological order (the fp16 converter appends input casts)."""
    ready = {i.name for i in graph.input} | {t.name for t in graph.initializer} | {""}
    pending, ordered = list(graph.node), []
    while pending:
        placed = [n for n in pending if all(name in ready for name in n.input)]
        if not placed:  # a cycle or outer-scope names: keep the rest in their order
            ordered += pending
            break
        for node in placed:
            ready.update(node.output)
        ordered += placed
        done = {id(n) for n in placed}
        pending = [n for n in pending if id(n) not in done]
    del graph.node[:]
    graph.node.extend(ordered)


def convert_fp16(src: Path, dst: Path) -> None:
    """Half-precision copy of ``src`` with float32 graph inputs and outputs kept."""
    import onnx  # noqa: PLC0415
    from onnxruntime.transformers.float16 import convert_float_to_float16  # noqa: PLC0415

    model = onnx.load(str(src))
    half = convert_float_to_float16(model, keep_io_types=True, disable_shape_infer=True)
    sort_nodes(half.graph)
    _atomic_write(dst, lambda tmp: onnx.save(half, str(tmp)))


def fuse_transformer(
    src: Path, dst: Path, model_type: str, num_heads: int, hidden_size: int, fp16: bool
) -> dict[str, int]:
    """ONNX Runtime's transformer fusions of ``src`` (then fp16 when asked) into ``dst``.

    Attention, SkipLayerNormalization, BiasGelu and EmbedLayerNormalization replace the
    exported chains of small ops: fewer, larger kernels on a GPU. Returns the fused
    operator counts the optimiser reports.
    """
    from onnxruntime.transformers.optimizer import optimize_model  # noqa: PLC0415

    optimized = optimize_model(
        str(src), model_type=model_type, num_heads=num_heads, hidden_size=hidden_size,
        opt_level=0, use_gpu=True,
    )
    if fp16:
        optimized.convert_float_to_float16(keep_io_types=True)
        sort_nodes(optimized.model.graph)
    _atomic_write(dst, lambda tmp: optimized.save_model_to_file(str(tmp)))
    return {k: int(v) for k, v in optimized.get_fused_operator_statistics().items() if v}


# Hugging Face ``model_type`` -> ONNX Runtime optimiser model type, for the encoders whose
# fused graph has been checked here (the build checks every fused graph again).
FUSABLE = {"bert": "bert", "roberta": "bert", "xlm-roberta": "bert"}


@dataclass(frozen=True)
class Fusion:
    """What ONNX Runtime's transformer optimiser needs to fuse one encoder's graph."""

    model_type: str
    num_heads: int
    hidden_size: int

    @classmethod
    def of(cls, config) -> Fusion | None:
        """The fusion of a Hugging Face ``config``, or None where none is known to hold."""
        kind = FUSABLE.get(getattr(config, "model_type", ""))
        if kind is None:
            return None
        return cls(kind, int(config.num_attention_heads), int(config.hidden_size))


def apply_fusion(
    path: Path,
    fusion: Fusion,
    spec: GraphSpec,
    module,
    cases: Sequence[dict[str, np.ndarray]],
) -> tuple[dict[str, int], str]:
    """Fuse the validated fp32 graph at ``path`` in place when the fused graph holds.

    Returns the fused operator counts and "" on success; on a failed parity check the
    graph stays as it was, and the reason comes back instead (the counts then empty).
    """
    fused = path.with_name(f"{path.stem}.fused.onnx")
    try:
        counts = fuse_transformer(
            path, fused, fusion.model_type, fusion.num_heads, fusion.hidden_size, fp16=False
        )
        if not counts.get("Attention") and not counts.get("MultiHeadAttention"):
            return {}, f"no attention block matched ONNX Runtime's {fusion.model_type} fusion"
        validate_graph(fused, spec, module, cases)
        fused.replace(path)
        return counts, ""
    except ExportValidationError as exc:
        return {}, "; ".join(exc.failures)[:400]
    finally:
        fused.unlink(missing_ok=True)


def fuse_graph(entry, config, path: Path, spec: GraphSpec, module, cases, log=print) -> bool:
    """Apply ``entry.graph_fusion`` to the validated fp32 graph at ``path``; True if fused.

    TensorRT makes its own fusions from the plain graph. What was done, and why not, goes
    to the build log: an unfused graph gives the same vectors.
    """
    if entry.graph_fusion != "on" or entry.gpu_accelerator == "tensorrt":
        return False
    fusion = Fusion.of(config)
    kind = getattr(config, "model_type", None)
    if fusion is None:
        log(f"{entry.name}: graph_fusion: none known for model_type {kind!r}; graph unfused")
        return False
    counts, why = apply_fusion(path, fusion, spec, module, cases)
    if why:
        log(f"{entry.name}: graph_fusion: the fused graph was not kept ({why}); graph unfused")
        return False
    shown = ", ".join(f"{op} {n}" for op, n in sorted(counts.items()))
    log(f"{entry.name}: graph_fusion: fused {kind} encoder ({shown}), checked against PyTorch")
    return True


CONVERTERS = {"int8": quantize_int8, "fp16": convert_fp16}


def validation_providers(precision: str) -> list[str]:
    """Where a derived graph is checked: fp16 on CUDA when this ONNX Runtime has it."""
    import onnxruntime as ort  # noqa: PLC0415

    if precision == "fp16" and "CUDAExecutionProvider" in ort.get_available_providers():
        return ["CUDAExecutionProvider", "CPUExecutionProvider"]
    return ["CPUExecutionProvider"]


def apply_precision(
    path: Path,
    precision: str,
    spec: GraphSpec,
    module,
    cases: Sequence[dict[str, np.ndarray]],
) -> ParityReport | None:
    """Turn the validated fp32 graph at ``path`` into ``precision`` in place, then check it.

    Returns the parity of the derived graph vs PyTorch (None for fp32). Raises
    :class:`ExportValidationError` when the derived graph misses :data:`PARITY`.
    """
    if precision == "fp32":
        return None
    if precision not in CONVERTERS:
        raise ValueError(f"precision must be one of {sorted(PARITY)}, not {precision!r}")
    derived = path.with_name(f"{path.stem}.{precision}.onnx")
    try:
        CONVERTERS[precision](path, derived)
        atol, min_cosine = PARITY[precision]
        providers = validation_providers(precision)
        # ONNX Runtime 1.31's extended CPU fusions crash on some fp16 graphs (a CLIP text
        # tower); the check measures the graph's numerics, basic rewrites suffice.
        on_cpu = providers[0] == "CPUExecutionProvider"
        basic = precision == "fp16" and on_cpu
        report = validate_graph(derived, spec, module, cases, atol, min_cosine, providers, basic)
        derived.replace(path)
    except ExportValidationError as exc:
        raise ExportValidationError(
            path, [f"{precision}: {failure}" for failure in exc.failures]
        ) from exc
    finally:
        derived.unlink(missing_ok=True)
    return report
