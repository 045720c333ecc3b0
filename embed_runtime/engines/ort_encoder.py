"""Run an exported encoder with ONNX Runtime over the requests of one ``execute``."""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import ClassVar

import numpy as np

from ..config_params import ConfigParams, param
from ..errors import InvalidInputError
from ..ops.busy_board import BusyBoard, board_path
from ..ops.integrity import verify_digests
from ..ops.weight_cache import cached_model, graph_level
from .ragged import Chunk, chunk_inputs, merge_requests, plan_chunks, run_sorted, split_counts

GRAPH_OPT_LEVELS = ("disable", "basic", "extended", "all")
EXECUTION_PROVIDERS = ("cpu", "cuda", "tensorrt")
AUTO_THREADS = -1  # shared_intra_op_threads "auto": the cores divided by the instances


def _threads(value: str) -> int:
    return AUTO_THREADS if value.strip().lower() == "auto" else int(value)


def _threads_text(value: int) -> str:
    return "auto" if value == AUTO_THREADS else str(value)


@dataclass(frozen=True)
class EncoderParams(ConfigParams):
    """How the encoder graph is run: the encoder's config parameters.

    The build writes them with :meth:`to_parameters`, the stub reads them back with
    :meth:`from_parameters`, which also checks the values.
    """

    params_name: ClassVar[str] = "encoder"

    onnx_file: str
    input_names: tuple[str, ...]
    output_name: str
    ragged: bool
    max_rows_per_run: int
    max_tokens_per_run: int = 0
    max_padding_share: float = param(1.0, always=True)
    intra_op_threads: int = param(0, always=True)
    shared_intra_op_threads: int = param(0, encode=_threads_text, decode=_threads)
    inter_op_threads: int = 1
    allow_spinning: bool = param(True, always=True)
    spin_duration_us: int = 0
    graph_optimization: str = param("all", always=True)
    execution_provider: str = param("cpu", always=True)
    vocab_size: int = 0
    type_vocab_size: int = 0
    max_width: int = 0
    max_dimensions: int = 0
    default_dimensions: int = param(0, with_field="max_dimensions")
    normalize: bool = param(False, with_field="max_dimensions")
    weight_cache: bool = True
    # TEXT in: the encoder tokenizes each execution's rows itself (TokenizerParams beside).
    fused_tokenize: bool = False
    # Sparse encoders: answer each request's rows as (indices, values) of their active
    # dimensions (embed_runtime.engines.sparse), capped at max_active_dims (0: no cap).
    sparse: bool = False
    max_active_dims: int = param(0, with_field="sparse")

    @classmethod
    def from_parameters(cls, params: Mapping[str, str]) -> EncoderParams:
        """Parse string config parameters; fail loudly on a missing or bad value."""
        out = super().from_parameters(params)
        if out.graph_optimization not in GRAPH_OPT_LEVELS:
            raise ValueError(f"graph_optimization must be one of {GRAPH_OPT_LEVELS}")
        if out.execution_provider not in EXECUTION_PROVIDERS:
            raise ValueError(f"execution_provider must be one of {EXECUTION_PROVIDERS}")
        if out.max_rows_per_run < 1:
            raise ValueError("max_rows_per_run must be >= 1")
        if not 0.0 <= out.max_padding_share <= 1.0:
            raise ValueError("max_padding_share must be within [0, 1]")
        if out.max_active_dims < 0:
            raise ValueError("max_active_dims must be >= 0")
        if out.sparse and out.max_dimensions:
            raise ValueError("a sparse encoder takes no dimensions (max_dimensions)")
        if out.shared_intra_op_threads < AUTO_THREADS:
            raise ValueError("shared_intra_op_threads must be 'auto' or >= 0")
        if out.shared_intra_op_threads and out.execution_provider != "cpu":
            raise ValueError("shared_intra_op_threads applies to the cpu provider only")
        return out


def available_cores(cgroup_cpu_max: str = "/sys/fs/cgroup/cpu.max") -> int:
    """Cores this process may use: its CPU affinity, capped by a cgroup v2 CPU quota.

    A container limited to 2 CPUs on a 64-core node sees 64 cores in its affinity mask;
    the quota (``cpu.max``: ``"200000 100000"``) says 2.
    """
    cores = len(os.sched_getaffinity(0))
    try:
        quota, period = open(cgroup_cpu_max).read().split()[:2]
    except (OSError, ValueError):
        return cores
    if quota == "max":
        return cores
    return max(1, min(cores, math.ceil(int(quota) / int(period))))


def shared_threads(setting: int, instances: int, cores: int) -> int:
    """Threads per run while other instances run: ``auto`` splits the cores between them."""
    if setting != AUTO_THREADS:
        return setting
    return max(1, cores // max(1, instances))


def check_request(params: EncoderParams, arrays: dict[str, np.ndarray]) -> None:
    """Validate one request's encoder inputs; :class:`InvalidInputError` says what is wrong.

    The tokenizer step always produces valid tensors, but every step can be called
    directly: token ids must index the vocabulary, widths stay within the model's
    maximum, masks are 0/1 with right padding (at least one real token per row), and
    float inputs are finite. Checked per request, so a bad one fails alone.
    """
    shapes = {a.shape for a in arrays.values()}
    first = next(iter(arrays.values()))
    if len(shapes) != 1 or first.ndim < 2 or first.shape[0] == 0 or 0 in first.shape:
        raise InvalidInputError(f"inputs {list(arrays)} need one shape and at least one row")
    for name, array in arrays.items():
        if array.dtype.kind == "f":
            if not np.isfinite(array).all():
                raise InvalidInputError(f"{name} holds NaN or infinite values")
            continue
        width = array.shape[1]
        if params.max_width and width > params.max_width:
            raise InvalidInputError(
                f"{name} is {width} tokens wide, over this model's maximum of {params.max_width}"
            )
        low, high = int(array.min()), int(array.max())
        limit = {
            "input_ids": params.vocab_size,
            "token_type_ids": params.type_vocab_size,
            "attention_mask": 2,
        }.get(name, 0)
        if low < 0 or (limit and high >= limit):
            raise InvalidInputError(
                f"{name} values must lie in [0, {limit - 1}], got [{low}, {high}]"
                if limit
                else f"{name} values must not be negative, got {low}"
            )
        if name == "attention_mask" and (
            not array[:, 0].all() or (np.diff(array, axis=1) > 0).any()
        ):
            raise InvalidInputError(
                "attention_mask rows must start with 1 and be right-padded (1s, then 0s)"
            )


def providers(name: str, device_id: int = 0, available: Sequence[str] | None = None) -> list:
    """ONNX Runtime providers for ``execution_provider`` ``name`` on GPU ``device_id``.

    ``cuda`` needs onnxruntime-gpu's CUDA provider: without it the session would quietly
    run on the CPU, so this fails instead. ``tensorrt`` falls back to CUDA when the
    TensorRT provider is missing (ONNX Runtime does that per node anyway).
    """
    if available is None:
        import onnxruntime as ort  # noqa: PLC0415

        available = ort.get_available_providers()
    if name == "cpu":
        return ["CPUExecutionProvider"]
    if "CUDAExecutionProvider" not in available:
        raise RuntimeError(
            f"execution_provider {name!r} needs onnxruntime-gpu (CUDAExecutionProvider); "
            f"this onnxruntime offers {list(available)}"
        )
    gpu = {"device_id": device_id}
    chain = [("CUDAExecutionProvider", gpu), "CPUExecutionProvider"]
    if name == "tensorrt" and "TensorrtExecutionProvider" in available:
        chain.insert(0, ("TensorrtExecutionProvider", gpu))
    return chain


def checked_placement(session, execution_provider: str):
    """``session``, or an error when a GPU provider was asked for and the CPU got it.

    ONNX Runtime drops the CUDA provider with only a log line when one of its CUDA or
    cuDNN libraries fails to load, and then runs every node on the CPU.
    """
    placed = session.get_providers()
    if execution_provider != "cpu" and placed[0] == "CPUExecutionProvider":
        raise RuntimeError(
            f"execution_provider {execution_provider!r} asked for, but ONNX Runtime placed "
            f"the session on {placed}: a CUDA/cuDNN library failed to load (see the log)"
        )
    return session


class OrtEncoder:
    """The ONNX Runtime session(s) of one model instance, built once.

    With ``shared_intra_op_threads`` set (CPU only) and a ``board`` shared with the
    model's other instances, the instance holds a second session with that many threads
    and uses it for every execution that starts while another instance is running; alone
    it keeps ``intra_op_threads``. Two single-threaded runs side by side beat two
    two-threaded runs fighting over two cores, and one lone request still gets both.
    """

    def __init__(self, model_path: str, params: EncoderParams, device_id: int = 0, board=None):
        self.params = params
        self.shared_session = self.board = None
        if board is not None and params.shared_intra_op_threads > 0:
            self.board = board
        # CPU: the sessions load this host's optimised copy (cached_model), whose packed
        # weights every session of every instance maps; any problem with it (no writable
        # cache, a bad file) falls back to optimising the graph in this process.
        self.model_path, self.cache_error, self.cache_repairs = model_path, "", []
        if params.weight_cache and params.execution_provider == "cpu":
            try:
                cached = cached_model(
                    model_path, params.graph_optimization, on_repair=self.cache_repairs.append
                )
                self._open(cached, "disable", device_id)
                self.model_path = cached
            except Exception as exc:  # noqa: BLE001 - the cache is an optimisation only
                self.cache_error = f"{type(exc).__name__}: {exc}"
        if self.model_path == model_path:
            self._open(model_path, params.graph_optimization, device_id)
        self._current = self.session
        self.shared_runs = 0
        self.run_ns = 0  # time inside ONNX Runtime's runs since the start (step timing)
        graph_inputs = {i.name for i in self.session.get_inputs()}
        missing = set(params.input_names) - graph_inputs
        if missing:
            raise ValueError(f"graph {model_path} lacks inputs {sorted(missing)}")

    def _open(self, model_path: str, level: str, device_id: int) -> None:
        self.session = self._session(model_path, self.params.intra_op_threads, device_id, level)
        if self.board is not None:
            threads = self.params.shared_intra_op_threads
            self.shared_session = self._session(model_path, threads, device_id, level)

    def _session(self, model_path: str, threads: int, device_id: int, level: str):
        import onnxruntime as ort  # noqa: PLC0415 - serve-time dependency

        params = self.params
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = params.inter_op_threads
        # Idle intra-op workers busy-wait for the next run by default. Turning that off
        # frees cores for Triton and the other stubs, but measured slower on a 2-core CPU
        # (waking the workers costs more), hence a knob with spinning on by default.
        spin = "1" if params.allow_spinning else "0"
        options.add_session_config_entry("session.intra_op.allow_spinning", spin)
        # How long a worker spins once it runs out of work. ONNX Runtime's default keeps
        # one core busy for milliseconds after every run, which on a small CPU starves
        # the tokenizer, Triton and the other instances; a few microseconds still bridge
        # the gaps between the operators of one run.
        if params.spin_duration_us:
            duration = str(params.spin_duration_us)
            options.add_session_config_entry("session.intra_op.spin_duration_us", duration)
        options.graph_optimization_level = graph_level(ort, level)
        chain = providers(params.execution_provider, device_id)
        session = ort.InferenceSession(model_path, sess_options=options, providers=chain)
        return checked_placement(session, params.execution_provider)

    def _run(self, inputs: dict[str, np.ndarray]) -> np.ndarray:
        start = time.perf_counter_ns()
        try:
            return self._current.run([self.params.output_name], inputs)[0]
        finally:
            self.run_ns += time.perf_counter_ns() - start

    @contextlib.contextmanager
    def _pick_session(self):
        """Run on the shared-threads session while another instance is running."""
        if self.shared_session is None:
            yield
            return
        with self.board.running() as others:
            self._current = self.shared_session if others else self.session
            self.shared_runs += bool(others)
            try:
                yield
            finally:
                self._current = self.session

    def encode_tokens(self, requests: Sequence[dict[str, np.ndarray]]) -> list[np.ndarray]:
        """Embed the token tensors of many requests: sort by length, pad per chunk."""
        merged, lengths, counts = merge_requests(requests)
        with self._pick_session():
            out = run_sorted(
                merged,
                lengths,
                self.params.max_rows_per_run,
                self._run,
                self.params.max_tokens_per_run,
                self.params.max_padding_share,
            )
        return list(split_counts(out, counts))

    def run_chunks(
        self, merged: dict[str, np.ndarray], lengths: np.ndarray
    ) -> list[tuple[Chunk, np.ndarray]]:
        """Run merged token rows sorted by ``lengths``, each chunk padded to its own width.

        Returns each chunk with its raw output, for graphs whose output keeps the token
        axis (``[rows, width, D]``: multi-vector encoders).
        """
        p = self.params
        chunks = plan_chunks(lengths, p.max_rows_per_run, p.max_tokens_per_run, p.max_padding_share)
        with self._pick_session():
            return [(c, self._run(chunk_inputs(merged, c))) for c in chunks]

    def encode_dense(self, requests: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Embed fixed-shape inputs (pixels, fixed-context tokens) in chunks."""
        counts = [len(r) for r in requests]
        merged = np.concatenate(requests, axis=0)
        step = self.params.max_rows_per_run
        name = self.params.input_names[0]
        with self._pick_session():
            parts = [self._run({name: merged[i : i + step]}) for i in range(0, len(merged), step)]
        return list(split_counts(np.concatenate(parts, axis=0), counts))


@dataclass(frozen=True)
class OpenedEncoder:
    """What a text-taking encoder stub opens at load: its settings, folder and session."""

    params: EncoderParams
    model_dir: str
    encoder: OrtEncoder


def open_encoder(
    args: Mapping[str, str], parameters: Mapping[str, str], instances: int = 1
) -> OpenedEncoder:
    """The model folder's digests checked, then its graph opened as ``EncoderParams`` say.

    ``args`` are the ones Triton's Python backend passes to ``initialize``; ``parameters``
    the model's config parameters. A corrupt model file fails the load, never an answer.
    With ``shared_intra_op_threads`` and more than one of ``instances``, the instance
    also opens the session it runs while another instance runs (a :class:`BusyBoard`
    tells), unless both sessions would get the same threads.
    """
    params = EncoderParams.from_parameters(parameters)
    board = None
    if params.shared_intra_op_threads and instances > 1:
        shared = shared_threads(params.shared_intra_op_threads, instances, available_cores())
        params = replace(params, shared_intra_op_threads=shared)
        if shared != params.intra_op_threads:  # else one session serves both cases
            board = BusyBoard(board_path(args["model_name"], args["model_version"]))
    model_dir = os.path.join(args["model_repository"], args["model_version"])
    verify_digests(model_dir)
    device_id = int(args.get("model_instance_device_id") or 0)
    path = os.path.join(model_dir, params.onnx_file)
    encoder = OrtEncoder(path, params, device_id, board)
    return OpenedEncoder(params, model_dir, encoder)
