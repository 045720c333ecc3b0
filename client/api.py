"""``EmbeddingClient``: a thin typed client over tritonclient (HTTP or gRPC).

Example::

    with EmbeddingClient("localhost:8000") as client:
        vectors = client.embed_texts("all-MiniLM-L6-v2", ["a sentence", "another"])
        images = client.embed_images("clip-vit-b-32", ["cat.jpg", "https://host/dog.png"])
        clip_text = client.embed_texts("clip-vit-b-32_text", ["a photo of a cat"])
"""

from __future__ import annotations

import importlib
import os
import re
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .chunks import ChunksMixin
from .clip_scores import ClipScoresMixin
from .deadline import Deadline
from .errors import EmbeddingClientError
from .model_management import ModelManagementMixin
from .multivector import MultiVectorMixin
from .payload import (
    ImageItem,
    encode_texts,
    image_target,
    reassemble,
    request_parameters,
    route_images,
    split_batches,
)
from .records import (
    ModelInfo,
    ModelStats,
    parse_repository_index,
    summarize_statistics,
    unwrap_model_config,
)
from .rerank import RerankMixin
from .retry import DEFAULT_RETRY, NO_RETRY, RetryBudget, RetryPolicy
from .sending import GRPC_MAX_MESSAGE_BYTES as GRPC_MAX_MESSAGE_BYTES
from .sending import MAX_IN_FLIGHT, SendMixin, checked_rows, grpc_channel_args
from .sending import RECONNECT_BACKOFF_MS as RECONNECT_BACKOFF_MS
from .sparse import sparse_rows

DEFAULT_PORTS = {"http": 8000, "grpc": 8001}
TEXT_INPUT = "TEXT"
OUTPUT = "EMBEDDING"
COUNT_OUTPUT = "TOKEN_COUNT"  # optional: each row's token count
SPARSE_OUTPUTS = ("SPARSE_INDICES", "SPARSE_VALUES")
# precision -> (output, dtype): the optional quantized forms of text models (python-ort)
PRECISION_OUTPUTS: dict[str, tuple[str, type]] = {
    "float32": (OUTPUT, np.float32),
    "float16": ("EMBEDDING_FP16", np.float16),
    "int8": ("EMBEDDING_INT8", np.int8),
    "uint8": ("EMBEDDING_UINT8", np.uint8),
    "binary": ("EMBEDDING_BINARY", np.int8),
    "ubinary": ("EMBEDDING_UBINARY", np.uint8),
}
DEFAULT_MAX_REQUEST_BYTES = 32 * 1024 * 1024
ADMIN_HEADER = "X-Admin-Key"
ADMIN_KEY_ENV = "EMBED_ADMIN_KEY"
ADMIN_KEY_FILE_ENV = "EMBED_ADMIN_KEY_FILE"
# The key `make serve` makes when it is given none (generator.admin.local_key_path: the
# same file), read only for a server on this machine.
LOCAL_KEY_FILE_ENV = "EMBED_LOCAL_ADMIN_KEY_FILE"
LOCAL_KEY_FILE = Path(__file__).resolve().parents[1] / ".build" / "admin-key"
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "[::1]", "::1")
# gRPC metadata is lower case; Triton's gRPC API restriction reads the key under this prefix.
GRPC_RESTRICTED_PREFIX = "triton-grpc-protocol-"
_BATCH_LIMIT = re.compile(r"batch-size must be <= (\d+)")


def admin_key_from_env(environ: Mapping[str, str] | None = None) -> str | None:
    """``$EMBED_ADMIN_KEY``, else the content of the file ``$EMBED_ADMIN_KEY_FILE``, else None."""
    env = os.environ if environ is None else environ
    if env.get(ADMIN_KEY_ENV):
        return env[ADMIN_KEY_ENV]
    path = env.get(ADMIN_KEY_FILE_ENV)
    if path:
        try:
            with open(path, encoding="utf-8") as handle:
                return handle.read().rstrip("\r\n") or None
        except OSError as exc:
            raise EmbeddingClientError(f"cannot read {ADMIN_KEY_FILE_ENV}={path}: {exc}") from exc
    return None


def _precision_output(precision: str, parameters: dict[str, Any]) -> tuple[str, type]:
    """The output and dtype of ``precision``; adds the ``precision`` request parameter.

    The parameter lets the server compute only that form (without it, every form).
    """
    if precision not in PRECISION_OUTPUTS:
        raise ValueError(f"precision must be one of {', '.join(PRECISION_OUTPUTS)}")
    if precision != "float32":
        parameters["precision"] = precision
    return PRECISION_OUTPUTS[precision]


def _text_parameters(prompt_name, dimensions, truncate, truncation_direction) -> dict[str, Any]:
    """The request parameters of a text embedding call: each option given, by its name."""
    return request_parameters(
        prompt_name=prompt_name,
        dimensions=dimensions,
        truncate=truncate,
        truncation_direction=truncation_direction,
    )


def local_admin_key(url: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The local key of ``make serve`` when ``url`` is on this machine and the file is there.

    The file must be this user's and private (mode 0600), as ``make serve`` writes it; a
    key for a server elsewhere is never taken from it.
    """
    env = os.environ if environ is None else environ
    host = url.rsplit(":", 1)[0] if url.count(":") == 1 or url.startswith("[") else url
    if host not in LOOPBACK_HOSTS:
        return None
    path = Path(env.get(LOCAL_KEY_FILE_ENV) or LOCAL_KEY_FILE)
    try:
        info = path.lstat()
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
            return None
        return path.read_text(encoding="utf-8").rstrip("\r\n") or None
    except OSError:
        return None


def admin_headers(key: str | None, protocol: str) -> dict[str, str]:
    """Headers presenting the admin key to Triton's restricted APIs and to model_manager."""
    if not key:
        return {}
    if protocol == "grpc":
        header = ADMIN_HEADER.lower()
        return {header: key, GRPC_RESTRICTED_PREFIX + header: key}
    return {ADMIN_HEADER: key}


def default_url(protocol: str) -> str:
    """Return ``localhost`` with Triton's default port for ``protocol``."""
    return f"localhost:{DEFAULT_PORTS[protocol]}"


class EmbeddingClient(
    SendMixin, ModelManagementMixin, RerankMixin, MultiVectorMixin, ClipScoresMixin, ChunksMixin
):
    """Embed texts and images with models served by Triton; query server state.

    Every failure (Triton error, unreachable server, unreadable local file, bad input)
    raises :class:`EmbeddingClientError`. Embedding methods return float32 ``[N, D]``
    arrays in input order; an empty input list returns an empty ``(0, 0)`` array without
    calling the server. Inputs are split into requests of at most the model's
    ``max_batch_size`` items (read once per model from its config) and about
    ``max_request_bytes`` bytes (Triton caps HTTP bodies at 64 MB by default), so any
    number of inputs can be passed; up to ``max_in_flight`` of those requests are sent at
    once. Each embedding call has one deadline, ``timeout_s``,
    across its requests and their retries; refused requests are retried
    (:mod:`client.retry`), and :class:`~client.ServerOverloadedError` says when no retry
    was left, :class:`~client.DeadlineExceededError` when the deadline passed. Not
    thread-safe: use one client per thread (a :class:`~client.RetryBudget` may be shared).
    """

    def __init__(
        self,
        url: str | None = None,
        protocol: str = "http",
        timeout_s: float = 60.0,
        *,
        max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
        admin_key: str | None = None,
        retry: RetryPolicy | None = DEFAULT_RETRY,
        retry_budget: RetryBudget | None = None,
        max_in_flight: int = MAX_IN_FLIGHT,
    ):
        """Connect lazily to Triton at ``url`` (``host:port``, no scheme).

        ``url`` defaults to ``localhost:8000`` for HTTP and ``localhost:8001`` for gRPC.
        ``timeout_s`` bounds each call as a whole: an embedding call that splits into
        several requests, with their retries, ends within it. Each request is sent with
        the time left, as its transport timeout (HTTP: the client closes the connection;
        gRPC: the call's deadline) and as the request parameter ``deadline_unix_us``
        (:data:`client.deadline.DEADLINE_PARAMETER`), which the server's steps check
        before they work. ``retry`` (default :data:`client.retry.DEFAULT_RETRY`; None: no
        retries) retries refusals with jittered backoff, within ``retry_budget`` (default:
        a :class:`~client.RetryBudget` of this client; pass one to share it between
        clients). ``admin_key`` (default: ``$EMBED_ADMIN_KEY``, the file
        ``$EMBED_ADMIN_KEY_FILE``, or for a server on this machine the local key file of
        ``make serve``; ``""``: none) is sent as ``X-Admin-Key`` with the calls that need
        it: the repository index, model configs and ``model_manager``. ``max_in_flight``:
        the requests of one call (inputs past the model's ``max_batch_size``) sent at once
        (1: one after another); answers keep input order.
        """
        if protocol not in DEFAULT_PORTS:
            raise EmbeddingClientError(f"protocol must be 'http' or 'grpc', got {protocol!r}")
        self.url = url or default_url(protocol)
        if "://" in self.url:
            raise EmbeddingClientError(f"url must be host:port without a scheme, got {self.url!r}")
        self.protocol = protocol
        self.timeout_s = timeout_s
        self.max_request_bytes = max_request_bytes
        if type(max_in_flight) is not int or max_in_flight < 1:
            raise EmbeddingClientError(f"max_in_flight must be an integer >= 1: {max_in_flight!r}")
        self.max_in_flight = max_in_flight
        self._threads = None  # the worker threads of gRPC parts in flight, made on first use
        self.retry = retry or NO_RETRY
        self.retry_budget = retry_budget or RetryBudget(clock=self.retry.clock)
        self._deadline: Deadline | None = None
        if admin_key is None:  # "" is an explicit "no key"
            admin_key = admin_key_from_env() or local_admin_key(self.url)
        self._admin = {"headers": admin_headers(admin_key, protocol)}
        self._max_batch: dict[str, int] = {}
        self._closed = False
        self._tc = importlib.import_module(f"tritonclient.{protocol}")
        with self._errors():
            if protocol == "http":
                self._client = self._tc.InferenceServerClient(
                    self.url,
                    connection_timeout=timeout_s,
                    network_timeout=timeout_s,
                    concurrency=max_in_flight,
                )
                self._call: dict[str, Any] = {}
                self._json: dict[str, Any] = {}
                self._gevent = importlib.import_module("gevent")
            else:
                self._client = self._tc.InferenceServerClient(
                    self.url, channel_args=grpc_channel_args(self._tc.KeepAliveOptions())
                )
                self._call = {"client_timeout": timeout_s}
                self._json = {"as_json": True}

    def __enter__(self) -> EmbeddingClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the underlying connection; safe to call more than once."""
        if not self._closed:
            self._closed = True
            if self._threads is not None:
                self._threads.shutdown()
            self._client.close()

    def embed_texts(
        self,
        model: str,
        texts: Sequence[str],
        *,
        prompt_name: str | None = None,
        dimensions: int | None = None,
        truncate: bool | None = None,
        truncation_direction: str | None = None,
        precision: str = "float32",
    ) -> np.ndarray:
        """Embed ``texts`` with the text ensemble ``model`` (CLIP: ``<name>_text``).

        ``prompt_name`` picks one of the model's prompts (else its default, if any);
        ``dimensions`` k keeps the first k values (Matryoshka), renormalised when the
        model normalises; ``truncate=False`` refuses a text longer than the model's limit
        instead of cutting it (the default cuts, as sentence-transformers does), and
        ``truncation_direction="left"`` cuts it at its start, keeping its end. They
        travel as request parameters. ``precision`` (``float32``, ``float16``, ``int8``,
        ``uint8``, ``binary``, ``ubinary``) returns that form, as
        ``sentence_transformers.quantization.quantize_embeddings`` makes it of the
        float32 rows (int8 / uint8 with the model's stored calibration ranges; the binary
        forms are packed bits, [N, ceil(D / 8)]); python-ort text models offer them.
        """
        parameters = _text_parameters(prompt_name, dimensions, truncate, truncation_direction)
        output = _precision_output(precision, parameters)
        return self._embed(model, TEXT_INPUT, encode_texts(texts), parameters, output=output)

    def embed_texts_with_counts(
        self,
        model: str,
        texts: Sequence[str],
        *,
        prompt_name: str | None = None,
        dimensions: int | None = None,
        truncate: bool | None = None,
        truncation_direction: str | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`embed_texts` plus each text's token count (INT32 [N]).

        The tokens the encoder saw, prompt and special tokens included, after truncation:
        what to meter usage by. Text models with the python-ort encoder answer it.
        """
        parameters = _text_parameters(prompt_name, dimensions, truncate, truncation_direction)
        return self._embed(model, TEXT_INPUT, encode_texts(texts), parameters, counts=True)

    def embed_images(self, model: str, images: Sequence[ImageItem]) -> np.ndarray:
        """Embed images with the CLIP model ``model``.

        Each item is encoded image ``bytes`` (sent to ``<model>_image``), an http(s) URL
        or ``data:`` URI string (sent to ``<model>_image_url``, fetched by the server), or
        a local path (``str`` / ``PathLike``, read here and sent as bytes). A mixed list
        is split between the two ensembles; rows come back in input order. A ``model``
        ending in ``_image`` or ``_image_url`` names the ensemble directly.
        """
        base, forced = image_target(model)
        groups = route_images(images, forced)
        with self._call_deadline():
            parts = [
                (
                    group.indices,
                    self._embed(f"{base}_{group.kind}", group.input_name, group.payloads),
                )
                for group in groups
            ]
        return reassemble(len(images), parts)

    def embed_sparse(
        self,
        model: str,
        texts: Sequence[str],
        *,
        task: str | None = None,
        prompt_name: str | None = None,
        max_active_dims: int | None = None,
        truncate: bool | None = None,
        truncation_direction: str | None = None,
    ) -> list[tuple[np.ndarray, np.ndarray]]:
        """Sparse embeddings of ``texts`` from the sparse-encoder ensemble ``model``.

        Per text, ``(indices, values)``: its active vocabulary dimensions (int32) and
        their weights (float32), by weight descending, the server's padding removed.
        ``max_active_dims`` k keeps each text's k largest weights, in place of the
        model's own cap, as ``SparseEncoder.encode(max_active_dims=k)`` does. ``task``
        (``"query"`` / ``"document"``) picks an inference-free model's route, as
        ``encode_query`` / ``encode_document`` do (default: document).
        """
        parameters = request_parameters(task=task, max_active_dims=max_active_dims)
        parameters |= request_parameters(
            prompt_name=prompt_name, truncate=truncate, truncation_direction=truncation_direction
        )
        return self._text_rows(model, texts, lambda p: self._infer_sparse(model, p, parameters))

    def _infer_sparse(
        self, model: str, items: list[bytes], parameters: dict | None
    ) -> list[tuple[np.ndarray, np.ndarray]]:
        indices, values = self._text_outputs(model, items, SPARSE_OUTPUTS, parameters)
        indices = checked_rows(indices, SPARSE_OUTPUTS[0], len(items), model, "K")
        try:
            return sparse_rows(indices, values)
        except ValueError as exc:  # VALUES missing or not of the indices' shape
            raise EmbeddingClientError(str(exc), model=model) from None

    def _embed(
        self,
        model: str,
        input_name: str,
        items: list[bytes],
        parameters: dict | None = None,
        counts: bool = False,
        output: tuple[str, type] = (OUTPUT, np.float32),
    ) -> Any:
        """Embeddings of ``items`` (and, with ``counts``, each row's ``TOKEN_COUNT``).

        ``output`` names the embedding output and its dtype (a quantized form).
        """
        name, dtype = output
        names = (name, COUNT_OUTPUT) if counts else (name,)

        def part_rows(part: list[bytes]) -> list[np.ndarray]:
            arrays = self._text_outputs(model, part, names, parameters, input_name)
            rows = [checked_rows(arrays[0], name, len(part), model, "D").astype(dtype, copy=False)]
            if counts:
                if arrays[1] is None or arrays[1].shape[0] != len(part):
                    expected = f"expected {COUNT_OUTPUT} of {len(part)} rows"
                    raise EmbeddingClientError(expected, model=model)
                rows.append(arrays[1].reshape(-1).astype(np.int32))
            return rows

        if not items:
            empty = np.zeros((0, 0), dtype=dtype)
            return (empty, np.zeros(0, dtype=np.int32)) if counts else empty
        parts = self._batched(model, items, part_rows)
        joined = [np.concatenate(arrays) for arrays in zip(*parts, strict=True)]
        return tuple(joined) if counts else joined[0]

    def _batched(self, model: str, items: list[bytes], call, extra_bytes: int = 0) -> list:
        """``call`` on each request-sized part of ``items`` (``max_batch_size``, bytes).

        ``extra_bytes``: what each item brings beside itself (a reranker's query).
        """
        sizes = [extra_bytes + len(item) for item in items]
        with self._call_deadline():
            try:
                slices = split_batches(sizes, self._max_batch_size(model), self.max_request_bytes)
                return self._each_part(call, [items[s] for s in slices])
            except EmbeddingClientError as exc:
                limit = _BATCH_LIMIT.search(exc.message)
                if limit is None or self._max_batch.get(model) != 0:
                    raise
                # The config is admin-only without a key: learn the limit from Triton's refusal.
                self._max_batch[model] = int(limit.group(1))
                return self._batched(model, items, call, extra_bytes)

    def _text_rows(self, model: str, texts: Sequence[str], infer) -> list:
        """The rows ``infer`` returns for each request-sized part of ``texts``, in order."""
        items = encode_texts(texts)
        return [row for part in self._batched(model, items, infer) for row in part] if items else []

    def _max_batch_size(self, model: str) -> int:
        """The model's ``max_batch_size`` from its config; 0 (unknown) without the admin key."""
        if model not in self._max_batch:
            try:
                config = self.model_config(model)
            except EmbeddingClientError as exc:
                if not _restricted(exc):
                    raise
                config = {}
            self._max_batch[model] = int(config.get("max_batch_size", 0))
        return self._max_batch[model]

    def is_server_ready(self) -> bool:
        """Whether the server is ready; ``False`` also when it cannot be reached."""
        try:
            with self._errors():
                return bool(self._client.is_server_ready(**self._call))
        except EmbeddingClientError:
            return False

    def is_model_ready(self, model: str) -> bool:
        """Whether ``model`` is loaded and ready; ``False`` if unknown or unreachable."""
        try:
            with self._errors(model):
                return bool(self._client.is_model_ready(model, **self._call))
        except EmbeddingClientError:
            return False

    def list_models(self) -> list[ModelInfo]:
        """List the repository index: every model Triton knows, loaded or not."""
        with self._errors():
            index = self._client.get_model_repository_index(
                **self._json, **self._call, **self._admin
            )
        return parse_repository_index(index)

    def model_statistics(self, model: str | None = None) -> list[ModelStats]:
        """Summarise Triton's statistics for ``model`` (all models if ``None``)."""
        with self._errors(model):
            stats = self._client.get_inference_statistics(model or "", **self._json, **self._call)
        return summarize_statistics(stats)

    def model_config(self, model: str) -> dict[str, Any]:
        """Return ``model``'s config as JSON (gRPC renders 64-bit ints as strings).

        Within the call's deadline; retried while the server cannot be reached.
        """

        def attempt(deadline: Deadline) -> Any:
            with self._errors(model), self._transport(deadline.remaining()) as timeout:
                return self._client.get_model_config(model, **self._json, **timeout, **self._admin)

        return unwrap_model_config(self._retried(model, attempt))

    def server_metadata(self) -> dict[str, Any]:
        """Return the server metadata (``name``, ``version``, ``extensions``)."""
        with self._errors():
            return dict(self._client.get_server_metadata(**self._json, **self._call))


def _restricted(exc: EmbeddingClientError) -> bool:
    """Whether Triton refused a call because the API needs the admin key."""
    return "is restricted" in exc.message or "protocol is restricted" in exc.message
