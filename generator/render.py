"""Render ``config.pbtxt`` files from Jinja templates and parse each one back.

Python computes every value; templates only place them. Each rendered text is parsed
with Triton's own ``ModelConfig`` protobuf (shipped by tritonclient) before it is
returned, so a malformed config fails the build, not the server start.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import jinja2
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from .onnx_export import TensorSpec

TEMPLATES = Path(__file__).parent / "templates"


class ConfigRenderError(ValueError):
    """A rendered config did not parse as a Triton ``ModelConfig``."""


@dataclass(frozen=True)
class IOSpec:
    """A config input or output (dims exclude the batch dim)."""

    name: str
    data_type: str
    dims: tuple[int, ...]
    ragged: bool = False
    # The shape the steps see, when it differs from ``dims`` (a config ``reshape``).
    reshape: tuple[int, ...] | None = None

    @classmethod
    def from_tensor(cls, tensor: TensorSpec, ragged: bool = False) -> IOSpec:
        """The config entry of an ONNX graph tensor."""
        return cls(tensor.name, tensor.triton_dtype, tensor.dims, ragged)


@dataclass(frozen=True)
class Batching:
    """Dynamic batching of one model."""

    enabled: bool = True
    max_queue_delay_us: int = 0
    preferred: tuple[int, ...] = ()
    max_queue_size: int = 0
    queue_timeout_us: int = 0

    @property
    def queue_policy(self) -> bool:
        """Whether the queue is bounded (in size or in time): a ``default_queue_policy``."""
        return bool(self.max_queue_size or self.queue_timeout_us)


@dataclass(frozen=True)
class Instances:
    """The instance group of one model."""

    count: int = 1
    kind: str = "KIND_CPU"


@dataclass(frozen=True)
class Step:
    """One ensemble step: ``inputs``/``outputs`` map step tensor -> ensemble tensor."""

    model: str
    inputs: tuple[tuple[str, str], ...]
    outputs: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Accelerator:
    """A GPU execution accelerator of the native onnxruntime backend."""

    name: str
    parameters: tuple[tuple[str, str], ...] = field(default_factory=tuple)


def _pbstr(value: object) -> str:
    return json.dumps(str(value), ensure_ascii=False)


_ENV = jinja2.Environment(
    loader=jinja2.FileSystemLoader(str(TEMPLATES)),
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
    keep_trailing_newline=True,
    autoescape=False,  # noqa: S701 - protobuf text, not HTML
)
_ENV.filters["pbstr"] = _pbstr


def parse_config(text: str) -> model_config_pb2.ModelConfig:
    """Parse config text with Triton's ``ModelConfig``; raise :class:`ConfigRenderError`."""
    try:
        return text_format.Parse(text, model_config_pb2.ModelConfig())
    except text_format.ParseError as exc:
        raise ConfigRenderError(f"invalid config.pbtxt: {exc}\n{text}") from exc


def render(template: str, **values: object) -> str:
    """Render ``templates/<template>.pbtxt.j2`` and check that it parses."""
    text = _ENV.get_template(f"{template}.pbtxt.j2").render(**values)
    config = parse_config(text)
    if config.name != values.get("name"):
        raise ConfigRenderError(f"rendered name {config.name!r} != {values.get('name')!r}")
    return text


def _model_config(
    template: str,
    name: str,
    max_batch_size: int,
    inputs: Sequence[IOSpec],
    outputs: Sequence[IOSpec],
    **values: object,
) -> str:
    """Render ``template`` with what every config has, its name and tensors, and ``values``."""
    return render(
        template,
        name=name,
        max_batch_size=max_batch_size,
        inputs=list(inputs),
        outputs=list(outputs),
        **values,
    )


def python_model(
    name: str,
    max_batch_size: int,
    inputs: Sequence[IOSpec],
    outputs: Sequence[IOSpec],
    parameters: dict[str, str],
    batching: Batching,
    instances: Instances,
) -> str:
    """Config of a Python-backend model."""
    return _model_config(
        "python_model",
        name,
        max_batch_size,
        inputs,
        outputs,
        parameters=sorted(parameters.items()),
        batching=batching,
        instances=instances,
    )


def onnxruntime_model(
    name: str,
    max_batch_size: int,
    inputs: Sequence[IOSpec],
    outputs: Sequence[IOSpec],
    batching: Batching,
    instances: Instances,
    accelerator: Accelerator | None = None,
    parameters: dict[str, str] | None = None,
) -> str:
    """Config of an encoder served by Triton's native ``onnxruntime`` backend."""
    return _model_config(
        "onnxruntime_model",
        name,
        max_batch_size,
        inputs,
        outputs,
        batching=batching,
        instances=instances,
        accelerator=accelerator,
        parameters=sorted((parameters or {}).items()),
    )


def ensemble(
    name: str,
    max_batch_size: int,
    inputs: Sequence[IOSpec],
    outputs: Sequence[IOSpec],
    steps: Sequence[Step],
) -> str:
    """Config of an ensemble chaining ``steps``."""
    return _model_config("ensemble", name, max_batch_size, inputs, outputs, steps=list(steps))
