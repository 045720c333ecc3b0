"""A small stand-in for Triton's ``triton_python_backend_utils`` (server-free tests).

Only what the adapters in ``embed_runtime/models`` use, with real behaviour: tensors hold
numpy arrays, responses hold tensors or one error, and the logger records messages.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from functools import partialmethod

import numpy as np


class TritonError:
    """An error carried by an ``InferenceResponse``."""

    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6

    def __init__(self, message: str, code: int = INTERNAL):
        self._message = message
        self._code = code

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code

    def __repr__(self) -> str:
        return f"TritonError({self._message!r}, {self._code})"


class Tensor:
    """A named tensor backed by a numpy array."""

    def __init__(self, name: str, array: np.ndarray):
        if not isinstance(array, np.ndarray):
            raise TypeError(f"Tensor {name}: expected a numpy array, got {type(array)}")
        self._name = name
        self._array = array

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._array


class InferenceRequest:
    """A request as seen by ``execute``: a set of named input tensors."""

    def __init__(
        self,
        inputs: Iterable[Tensor] = (),
        parameters: dict | None = None,
        requested_outputs: Iterable[str] | None = None,
        cancelled: bool = False,
    ):
        self.cancelled = cancelled
        self._inputs = list(inputs)
        self._parameters = json.dumps(parameters or {})
        self._requested = None if requested_outputs is None else list(requested_outputs)

    def inputs(self) -> list[Tensor]:
        return list(self._inputs)

    def parameters(self) -> str:
        return self._parameters

    def is_cancelled(self) -> bool:
        """Whether Triton marked the request cancelled (its client went away)."""
        return self.cancelled

    def requested_output_names(self) -> list[str] | None:
        """The outputs asked for; None stands for all of the model's (Triton lists them)."""
        return None if self._requested is None else list(self._requested)


class InferenceResponse:
    """Either output tensors or one error."""

    def __init__(
        self, output_tensors: list[Tensor] | None = None, error: TritonError | None = None
    ):
        if output_tensors is not None and not all(isinstance(t, Tensor) for t in output_tensors):
            raise TypeError("output_tensors must be Tensor objects")
        if error is not None and not isinstance(error, TritonError):
            raise TypeError("error must be a TritonError")
        self._outputs = list(output_tensors or [])
        self._error = error

    def output_tensors(self) -> list[Tensor]:
        return list(self._outputs)

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error

    def output(self, name: str) -> np.ndarray:
        """Test helper: the array of output ``name`` (KeyError if absent)."""
        for tensor in self._outputs:
            if tensor.name() == name:
                return tensor.as_numpy()
        raise KeyError(name)


def get_input_tensor_by_name(request: InferenceRequest, name: str) -> Tensor | None:
    """The input called ``name``, or None."""
    for tensor in request.inputs():
        if tensor.name() == name:
            return tensor
    return None


def get_output_tensor_by_name(response: InferenceResponse, name: str) -> Tensor | None:
    """The output called ``name``, or None."""
    for tensor in response.output_tensors():
        if tensor.name() == name:
            return tensor
    return None


class Logger:
    """Records messages by level instead of writing to the server log."""

    messages: list[tuple[str, str]] = []

    @classmethod
    def _record(cls, level: str, message: str) -> None:
        cls.messages.append((level, message))

    log_info = partialmethod(_record, "info")
    log_warn = partialmethod(_record, "warn")
    log_error = partialmethod(_record, "error")
    log_verbose = partialmethod(_record, "verbose")

    @classmethod
    def clear(cls) -> None:
        cls.messages.clear()


class MetricFamily:
    """A metric family whose metrics keep their value; ``families`` lists every one made."""

    COUNTER = 0
    GAUGE = 1
    families: list[MetricFamily] = []

    def __init__(self, name: str, description: str, kind: int):
        if kind not in (self.COUNTER, self.GAUGE):
            raise ValueError(f"unknown metric kind {kind}")
        self.name, self.description, self.kind = name, description, kind
        self.metrics: list[Metric] = []
        MetricFamily.families.append(self)

    def Metric(self, labels: dict[str, str]) -> Metric:  # Triton's name
        metric = Metric(self, dict(labels))
        self.metrics.append(metric)
        return metric


class Metric:
    """One labelled metric of a family."""

    def __init__(self, family: MetricFamily, labels: dict[str, str]):
        self.family, self.labels, self.value = family, labels, 0.0

    def increment(self, value: float) -> None:
        if self.family.kind == MetricFamily.COUNTER and value < 0:
            raise ValueError("a counter only goes up")
        self.value += value
