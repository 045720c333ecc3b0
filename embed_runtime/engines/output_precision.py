"""Output precision per request: the embedding as float16, int8, uint8, binary or ubinary.

Each form is its own optional output of a text ensemble (Triton fixes an output's dtype):
``EMBEDDING`` (float32), ``EMBEDDING_FP16``, ``EMBEDDING_INT8``, ``EMBEDDING_UINT8``,
``EMBEDDING_BINARY`` and ``EMBEDDING_UBINARY``. They quantize the float32 rows the
request would get (after ``dimensions`` and normalisation), exactly as
``sentence_transformers.quantization.quantize_embeddings`` does. int8 / uint8 take
per-dimension ranges from calibration embeddings computed at build time
(:data:`CALIBRATION_FILE`); a request with ``dimensions`` k uses the ranges of those
embeddings cut to k the same way.

Through an ensemble the encoder is asked for every output the ensemble maps, whatever
the client asked (verified on Triton 2.51), so without the optional request parameter
``precision`` every declared form is computed; with it, only that one.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

import numpy as np

from ..errors import InvalidInputError
from ..text.request_options import truncate

FLOAT32 = "float32"
# precision name -> (output name, numpy dtype, Triton data type)
FORMS: dict[str, tuple[str, type, str]] = {
    FLOAT32: ("EMBEDDING", np.float32, "TYPE_FP32"),
    "float16": ("EMBEDDING_FP16", np.float16, "TYPE_FP16"),
    "int8": ("EMBEDDING_INT8", np.int8, "TYPE_INT8"),
    "uint8": ("EMBEDDING_UINT8", np.uint8, "TYPE_UINT8"),
    "binary": ("EMBEDDING_BINARY", np.int8, "TYPE_INT8"),
    "ubinary": ("EMBEDDING_UBINARY", np.uint8, "TYPE_UINT8"),
}
PRECISIONS = tuple(FORMS)
EXTRA_PRECISIONS = PRECISIONS[1:]  # the optional outputs beside EMBEDDING
CALIBRATED = ("int8", "uint8")
CALIBRATION_FILE = "calibration_embeddings.npy"


def output_name(precision: str) -> str:
    """The output that carries ``precision`` (``EMBEDDING`` for float32)."""
    return FORMS[check_precision(precision)][0]


def check_precision(precision: str) -> str:
    """``precision`` if it is a known name; else :class:`InvalidInputError`."""
    if precision not in FORMS:
        raise InvalidInputError(f"unknown precision {precision!r}; one of {', '.join(PRECISIONS)}")
    return precision


def quantization_ranges(calibration: np.ndarray) -> np.ndarray:
    """Per-dimension ``[min, max]`` (shape [2, D]) as the library derives them."""
    return np.vstack((np.min(calibration, axis=0), np.max(calibration, axis=0)))


def quantize(
    embeddings: np.ndarray, precision: str, ranges: np.ndarray | None = None
) -> np.ndarray:
    """``quantize_embeddings(embeddings, precision, ranges=ranges)``, reproduced exactly.

    ``embeddings`` are float32 rows [N, k]; int8 / uint8 need ``ranges`` [2, k].
    """
    if precision == FLOAT32:
        return embeddings.astype(np.float32)
    if precision == "float16":
        return embeddings.astype(np.float16)
    if precision in CALIBRATED:
        if ranges is None:
            raise ValueError(f"{precision} needs calibration ranges")
        ranges = ranges.astype(np.float32, copy=False)
        starts = ranges[0, :]
        steps = (ranges[1, :] - starts) / 255
        steps = np.where(steps == 0, 1, steps)
        q_vals = np.clip(np.floor((embeddings - starts) / steps), 0, 255)
        if precision == "uint8":
            return q_vals.astype(np.uint8)
        return (q_vals - 128).astype(np.int8)
    if precision == "binary":
        return (np.packbits(embeddings > 0, axis=-1) - 128).astype(np.int8)
    if precision == "ubinary":
        return np.packbits(embeddings > 0, axis=-1)
    raise ValueError(f"precision {precision!r} is not supported")


class Calibration:
    """Calibration embeddings [N, D] and their ranges per request width, built once."""

    def __init__(self, embeddings: np.ndarray, normalize: bool):
        if embeddings.ndim != 2 or len(embeddings) < 2:
            raise ValueError("calibration embeddings must be [N >= 2, D]")
        self.embeddings = np.ascontiguousarray(embeddings, dtype=np.float32)
        self.normalize = normalize
        self._ranges: dict[int, np.ndarray] = {}

    @classmethod
    def load(cls, path: str, normalize: bool) -> Calibration:
        """Read :data:`CALIBRATION_FILE` (a plain ``.npy``, no pickles)."""
        return cls(np.load(path, allow_pickle=False), normalize)

    def ranges(self, width: int) -> np.ndarray:
        """Ranges [2, width]: of the calibration rows cut to ``width`` as requests are."""
        if width not in self._ranges:
            rows = truncate(self.embeddings, width, self.normalize)
            self._ranges[width] = quantization_ranges(rows)
        return self._ranges[width]


def resolve_precision(parameters: Mapping[str, Any], offered: Collection[str]) -> str | None:
    """The request's ``precision`` parameter (None: not given); refused if not ``offered``."""
    value = parameters.get("precision")
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidInputError(f"precision must be a string, got {value!r}")
    check_precision(value)
    if value != FLOAT32 and value not in offered:
        offers = ", ".join([FLOAT32, *offered])
        raise InvalidInputError(
            f"this model does not offer precision {value!r}; it offers {offers}"
        )
    return value


def precision_outputs(
    embeddings: np.ndarray,
    forms: Collection[str],
    calibration: Calibration | None,
) -> list[np.ndarray]:
    """One array per name of ``forms`` (in that order) from one request's float32 rows."""
    out = []
    for precision in forms:
        ranges = None
        if precision in CALIBRATED:
            if calibration is None:
                raise ValueError(f"{precision} needs calibration embeddings")
            ranges = calibration.ranges(embeddings.shape[-1])
        out.append(np.ascontiguousarray(quantize(embeddings, precision, ranges)))
    return out


def forms_to_compute(
    declared: Collection[str], requested: Collection[str] | None, chosen: str | None
) -> list[str]:
    """Which extra forms a request gets: the declared ones its outputs ask for.

    Narrowed to the ``precision`` parameter when it names one (the others are left out).
    ``requested`` holds output names (``request.requested_output_names()``; None: all).
    """
    forms = [p for p in EXTRA_PRECISIONS if p in declared]
    if requested is not None:
        forms = [p for p in forms if FORMS[p][0] in requested]
    if chosen is not None:
        forms = [p for p in forms if p == chosen]
    return forms


class OutputForms:
    """The extra forms an encoder declares, and its calibration; built once per instance."""

    def __init__(self, declared: Collection[str], calibration: Calibration | None = None):
        self.declared = tuple(p for p in EXTRA_PRECISIONS if p in declared)
        if calibration is None and any(p in CALIBRATED for p in self.declared):
            raise ValueError(f"int8 / uint8 outputs need {CALIBRATION_FILE}")
        self.calibration = calibration

    @classmethod
    def from_config(
        cls, output_names: Collection[str], model_dir: str, normalize: bool
    ) -> OutputForms:
        """The forms whose outputs the config declares; calibration read when int8 / uint8."""
        declared = [p for p in EXTRA_PRECISIONS if FORMS[p][0] in output_names]
        calibration = None
        if any(p in CALIBRATED for p in declared):
            calibration = Calibration.load(f"{model_dir}/{CALIBRATION_FILE}", normalize)
        return cls(declared, calibration)

    def select(
        self, parameters: Mapping[str, Any], requested: Collection[str] | None
    ) -> tuple[str, ...]:
        """The forms one request gets; a bad ``precision`` parameter refuses it alone."""
        chosen = resolve_precision(parameters, self.declared)
        return tuple(forms_to_compute(self.declared, requested, chosen))

    def outputs(self, embeddings: np.ndarray, forms: Collection[str]) -> dict[str, np.ndarray]:
        """``{output name: array}`` of ``forms`` for one request's float32 rows."""
        arrays = precision_outputs(embeddings, forms, self.calibration)
        return {FORMS[p][0]: a for p, a in zip(forms, arrays, strict=True)}
