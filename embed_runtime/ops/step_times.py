"""Opt-in timestamps inside a step's ``execute``, for breaking a request's latency down.

With ``EMBED_STEP_TIMES`` set to a folder in the server's environment, each encode
instance appends one tab-separated line per execution to
``<folder>/<model>.<pid>.tsv``: requests, rows, then microseconds spent reading the
requests (input decoding, checks), in ONNX Runtime's runs, in the rest of the embed call
(tokenizing, sorting, slicing the rows), building the responses, and the whole
``execute``. Triton's own statistics time the same execution from the server's side
(``compute_infer``); the difference is the Python backend's round trip. Off (the
default), nothing is timed or written.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

ENV = "EMBED_STEP_TIMES"
COLUMNS = ("requests", "rows", "read_us", "ort_us", "embed_other_us", "respond_us", "total_us")


def _opened(path: str, columns: tuple[str, ...]) -> str:
    """``path``, its header line written if the file is new."""
    with open(path, "a", encoding="utf-8") as out:
        if out.tell() == 0:
            out.write("\t".join(columns) + "\n")
    return path


def _env_path(env: str, model_name: str, suffix: str) -> str | None:
    """``<$env>/<model>.<pid><suffix>`` (the folder made), ``None`` when ``env`` is unset."""
    folder = os.environ.get(env, "")
    if not folder:
        return None
    os.makedirs(folder, exist_ok=True)
    return os.path.join(folder, f"{model_name}.{os.getpid()}{suffix}")


class StepTimes:
    """Phase durations of one execution, summed as the phases run, written at its end."""

    def __init__(self, path: str, clock: Callable[[], int] = time.perf_counter_ns):
        self.clock = clock
        self.path = _opened(path, COLUMNS)
        self.phases: dict[str, int] = {}
        self.rows = 0  # rows answered in the execution under way

    @classmethod
    def from_env(cls, model_name: str) -> StepTimes | None:
        """The recorder of this process, or ``None`` when ``EMBED_STEP_TIMES`` is unset."""
        path = _env_path(ENV, model_name, ".tsv")
        return None if path is None else cls(path)

    def timed(self, phase: str, fn: Callable) -> Callable:
        """``fn`` with its duration added to ``phase`` at every call."""

        def wrapper(*args, **kwargs):
            start = self.clock()
            try:
                return fn(*args, **kwargs)
            finally:
                self.phases[phase] = self.phases.get(phase, 0) + self.clock() - start

        return wrapper

    def write(self, requests: int, ort_ns: int, total_ns: int) -> None:
        """One line for the execution just ended; the phases start again from zero."""
        read, embed = self.phases.get("read", 0), self.phases.get("embed", 0)
        respond = total_ns - read - embed
        values = (read, ort_ns, embed - ort_ns, respond, total_ns)
        cells = [str(requests), str(self.rows), *(f"{v / 1e3:.1f}" for v in values)]
        self.phases, self.rows = {}, 0
        with open(self.path, "a", encoding="utf-8") as out:
            out.write("\t".join(cells) + "\n")


ESTIMATES_ENV = "EMBED_ADMISSION_TIMES"
ESTIMATE_COLUMNS = ("rows", "tokens", "estimate_us", "actual_us")


class EstimateLog:
    """Opt-in record of admission's estimates against what happened, one line a request.

    With ``EMBED_ADMISSION_TIMES`` set to a folder, each admitted-to instance appends to
    ``<folder>/<model>.<pid>.estimates.tsv``, for every request it answered that came
    with a ticket: its rows, its tokens, the wait the admitting step estimated when it
    admitted it (µs to its answer) and the time that actually passed until this execution
    ended (``bench.admission_estimate`` reads them). Off (the default), nothing is written.
    """

    def __init__(self, path: str):
        self.path = _opened(path, ESTIMATE_COLUMNS)

    @classmethod
    def from_env(cls, model_name: str) -> EstimateLog | None:
        """The recorder of this process, or ``None`` when ``EMBED_ADMISSION_TIMES`` is unset."""
        path = _env_path(ESTIMATES_ENV, model_name, ".estimates.tsv")
        return None if path is None else cls(path)

    def write(self, rows: list[tuple[int, int, int, int]]) -> None:
        """Lines of (rows, tokens, estimate µs, actual µs)."""
        if rows:
            with open(self.path, "a", encoding="utf-8") as out:
                out.writelines("\t".join(map(str, row)) + "\n" for row in rows)
