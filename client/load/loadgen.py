"""A closed-loop load generator: N client threads, each sending its own fixed requests.

Every thread builds its own connection (tritonclient clients are not shared across
threads) and prepares its request bodies before the clock starts, then all threads
start together and send back to back until each has sent its ``requests_per_client``
or ``max_seconds`` have passed, whichever comes first. Per-request latencies give the
mean / median / p95 / p99 / std; throughput counts only successful requests.

Two senders: :class:`TritonSender` (tritonclient, HTTP or gRPC, any ensemble with one
``BYTES`` input and an ``EMBEDDING`` output) and :class:`JsonPostSender` (plain HTTP
POST of a JSON body, for the peer services the benchmark compares against).
"""

from __future__ import annotations

import http.client
import importlib
import json
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import numpy as np

from ..payload import bytes_tensor
from ..records import ModelStats

OUTPUT = "EMBEDDING"
MAX_ERROR_SAMPLES = 5


class Sender(Protocol):
    """Sends prepared requests over one connection (one per thread)."""

    def prepare(self, items: Sequence[bytes]) -> Any:
        """Build the request body for ``items`` once, before timing starts."""

    def send(self, prepared: Any) -> int:
        """Send one prepared request; return the rows embedded or raise."""

    def close(self) -> None:
        """Release the connection."""


SenderFactory = Callable[[], Sender]


class TritonSender:
    """Infer one ensemble through tritonclient (``http`` or ``grpc``)."""

    def __init__(self, url: str, model: str, input_name: str, protocol: str = "grpc"):
        """Connect to ``url`` (``host:port``); requests go to ``model``'s ``input_name``."""
        self.model = model
        self.input_name = input_name
        self._tc = importlib.import_module(f"tritonclient.{protocol}")
        if protocol == "http":
            self._client = self._tc.InferenceServerClient(
                url, connection_timeout=120.0, network_timeout=120.0
            )
            self._output = self._tc.InferRequestedOutput(OUTPUT, binary_data=True)
            self._call: dict[str, Any] = {}
        else:
            self._client = self._tc.InferenceServerClient(url)
            self._output = self._tc.InferRequestedOutput(OUTPUT)
            self._call = {"client_timeout": 120.0}

    def prepare(self, items: Sequence[bytes]) -> Any:
        """An ``InferInput`` holding the serialised BYTES tensor ``[len(items), 1]``."""
        data = bytes_tensor(items)
        infer_input = self._tc.InferInput(self.input_name, list(data.shape), "BYTES")
        infer_input.set_data_from_numpy(data)
        return infer_input, len(items)

    def send(self, prepared: Any) -> int:
        """Infer and check that one embedding row came back per item."""
        infer_input, rows = prepared
        result = self._client.infer(self.model, [infer_input], outputs=[self._output], **self._call)
        embedding = result.as_numpy(OUTPUT)
        if embedding is None or embedding.shape[0] != rows:
            raise RuntimeError(
                f"expected {rows} embeddings, got {getattr(embedding, 'shape', None)}"
            )
        return rows

    def close(self) -> None:
        """Close the tritonclient connection."""
        self._client.close()


class JsonPostSender:
    """POST a JSON body over a keep-alive HTTP/1.1 connection; count rows in the reply."""

    def __init__(
        self,
        host: str,
        port: int,
        path: str,
        body: Callable[[list[str]], dict[str, Any]],
        rows: Callable[[Any], int],
        timeout_s: float = 120.0,
    ):
        """``body(texts)`` builds the request JSON, ``rows(reply_json)`` counts embeddings."""
        self.host, self.port, self.path, self.timeout_s = host, port, path, timeout_s
        self._body, self._rows = body, rows
        self._conn: http.client.HTTPConnection | None = None

    def prepare(self, items: Sequence[bytes]) -> Any:
        """The encoded JSON body and the number of items."""
        texts = [item.decode("utf-8") for item in items]
        return json.dumps(self._body(texts)).encode("utf-8"), len(items)

    def send(self, prepared: Any) -> int:
        """POST, parse the JSON reply and check the row count; reconnect after a failure."""
        body, expected = prepared
        if self._conn is None:
            self._conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
        try:
            self._conn.request("POST", self.path, body, {"Content-Type": "application/json"})
            response = self._conn.getresponse()
            payload = response.read()
        except (OSError, http.client.HTTPException):
            self.close()
            raise
        if response.status != 200:
            raise RuntimeError(f"HTTP {response.status}: {payload[:200]!r}")
        got = self._rows(json.loads(payload))
        if got != expected:
            raise RuntimeError(f"expected {expected} embeddings, got {got}")
        return got

    def close(self) -> None:
        """Close the connection (a later send reconnects)."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None


@dataclass(frozen=True)
class LoadSpec:
    """Shape of one load: how many clients, how much each sends, and for how long."""

    clients: int
    items_per_request: int
    requests_per_client: int
    warmup_requests: int = 2
    max_seconds: float = 60.0

    @property
    def label(self) -> str:
        """``<clients> x <items>``, as the tables show it."""
        return f"{self.clients} x {self.items_per_request}"


@dataclass
class LoadResult:
    """What one load achieved, client side and (optionally) server side."""

    label: str
    clients: int
    items_per_request: int
    requests: int
    items: int
    errors: int
    seconds: float
    qps: float
    items_per_s: float
    mean_ms: float
    median_ms: float
    p95_ms: float
    p99_ms: float
    std_ms: float
    min_ms: float
    max_ms: float
    error_samples: list[str] = field(default_factory=list)
    server: list[ModelStats] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict (server stats included)."""
        return asdict(self)


@dataclass
class _Worker:
    requests: list[list[bytes]]
    latencies: list[float] = field(default_factory=list)
    items: int = 0
    errors: int = 0
    samples: list[str] = field(default_factory=list)
    setup_error: BaseException | None = None
    finished: float = 0.0

    def record_error(self, exc: BaseException) -> None:
        self.errors += 1
        if len(self.samples) < MAX_ERROR_SAMPLES:
            self.samples.append(f"{type(exc).__name__}: {exc}"[:300])


def summarize(
    label: str,
    spec: LoadSpec,
    latencies_s: Sequence[float],
    items: int,
    errors: int,
    seconds: float,
) -> LoadResult:
    """Build a :class:`LoadResult` from raw per-request latencies (seconds)."""
    ms = np.asarray(latencies_s, dtype=np.float64) * 1000.0
    ok = len(ms)

    def stat(fn) -> float:
        return float(fn(ms)) if ok else 0.0

    return LoadResult(
        label=label,
        clients=spec.clients,
        items_per_request=spec.items_per_request,
        requests=ok,
        items=items,
        errors=errors,
        seconds=seconds,
        qps=ok / seconds if seconds > 0 else 0.0,
        items_per_s=items / seconds if seconds > 0 else 0.0,
        mean_ms=stat(np.mean),
        median_ms=stat(np.median),
        p95_ms=stat(lambda a: np.percentile(a, 95)),
        p99_ms=stat(lambda a: np.percentile(a, 99)),
        std_ms=statistics.pstdev(ms.tolist()) if ok > 1 else 0.0,
        min_ms=stat(np.min),
        max_ms=stat(np.max),
    )


def run_load(
    factory: SenderFactory,
    requests: Sequence[Sequence[bytes]],
    spec: LoadSpec,
    label: str | None = None,
    on_start: Callable[[], None] | None = None,
) -> LoadResult:
    """Run ``spec`` with ``factory`` senders over the fixed ``requests``.

    Client ``c`` sends ``requests[(c + k * clients) % len(requests)]`` for ``k = 0, 1,
    ...``, after ``warmup_requests`` untimed ones. ``on_start`` runs once every client is
    warmed up, just before the clock starts (the benchmark reads server statistics
    there); the caller reads them again after this returns.
    """
    workers = _assign(requests, spec)
    line = _StartLine(spec.clients)
    threads = [
        threading.Thread(target=_run_client, args=(factory, spec, w, line), daemon=True)
        for w in workers
    ]
    for thread in threads:
        thread.start()
    line.wait_until_ready()
    failed = [w.setup_error for w in workers if w.setup_error is not None]
    if on_start is not None and not failed:
        on_start()
    start = line.start(spec.max_seconds)
    for thread in threads:
        thread.join()
    if failed:
        raise RuntimeError(f"client set-up failed: {failed[0]}") from failed[0]
    return _result(label or spec.label, spec, workers, max(w.finished for w in workers) - start)


def _assign(requests: Sequence[Sequence[bytes]], spec: LoadSpec) -> list[_Worker]:
    """One worker per client, holding the requests it sends (its warm-up ones first)."""
    if not requests:
        raise ValueError("no requests to send")
    total = len(requests)
    sent = range(spec.warmup_requests + spec.requests_per_client)
    return [
        _Worker([list(requests[(c + k * spec.clients) % total]) for k in sent])
        for c in range(spec.clients)
    ]


class _StartLine:
    """Where the clients wait: until all are warmed up, then for one start and deadline."""

    def __init__(self, clients: int):
        self._ready = threading.Barrier(clients + 1)
        self._go = threading.Event()
        self._deadline = 0.0

    def wait_until_ready(self) -> None:
        """Return once every client is warmed up (the caller's side of the barrier)."""
        self._ready.wait()

    def start(self, max_seconds: float) -> float:
        """Start every client, with a deadline ``max_seconds`` from now; the start time."""
        start = time.perf_counter()
        self._deadline = start + max_seconds
        self._go.set()
        return start

    def wait_for_start(self) -> float:
        """A client's side: say it is ready, wait for the start; the deadline."""
        self._ready.wait()
        self._go.wait()
        return self._deadline


def _run_client(factory: SenderFactory, spec: LoadSpec, worker: _Worker, line: _StartLine) -> None:
    """One client thread: connect and prepare, warm up, wait for the start, send timed."""
    sender, prepared = _prepare(factory, worker)
    try:
        if sender is not None:
            _warm_up(sender, prepared[: spec.warmup_requests])
        deadline = line.wait_for_start()  # a client whose set-up failed waits too
        if sender is not None:
            _send_timed(sender, prepared[spec.warmup_requests :], deadline, worker)
    finally:
        worker.finished = time.perf_counter()
        if sender is not None:
            sender.close()


def _prepare(factory: SenderFactory, worker: _Worker) -> tuple[Sender | None, list[Any]]:
    """The client's sender and prepared bodies; a failure is kept for the caller to raise."""
    sender = None
    try:
        sender = factory()
        return sender, [sender.prepare(r) for r in worker.requests]
    except BaseException as exc:  # noqa: BLE001 - reported to the caller by run_load
        worker.setup_error = exc
        return sender, []


def _warm_up(sender: Sender, prepared: Sequence[Any]) -> None:
    """Send the untimed requests; their failures show up in the timed ones."""
    for item in prepared:
        try:
            sender.send(item)
        except Exception:  # noqa: BLE001, S110 - warm-up failures show up later
            pass


def _send_timed(sender: Sender, prepared: Sequence[Any], deadline: float, worker: _Worker) -> None:
    """Send back to back until done or ``deadline``; latencies, items and errors to ``worker``."""
    for item in prepared:
        if time.perf_counter() >= deadline:
            break
        start = time.perf_counter()
        try:
            worker.items += sender.send(item)
        except Exception as exc:  # noqa: BLE001 - counted as an error
            worker.record_error(exc)
            continue
        worker.latencies.append(time.perf_counter() - start)


def _result(label: str, spec: LoadSpec, workers: Sequence[_Worker], seconds: float) -> LoadResult:
    """The run's :class:`LoadResult` from every worker's figures."""
    result = summarize(
        label,
        spec,
        [lat for w in workers for lat in w.latencies],
        sum(w.items for w in workers),
        sum(w.errors for w in workers),
        seconds,
    )
    result.error_samples = [s for w in workers for s in w.samples][:MAX_ERROR_SAMPLES]
    return result


def format_result(result: LoadResult, unit: str = "items") -> str:
    """A human-readable block: client-side figures, then one line per server-side model."""
    lines = [
        f"load {result.label}: {result.requests} requests, {result.items} {unit}, "
        f"{result.errors} errors in {result.seconds:.2f} s",
        f"  throughput  {result.qps:9.1f} req/s  {result.items_per_s:9.1f} {unit}/s",
        f"  latency ms  mean {result.mean_ms:.2f}  median {result.median_ms:.2f}  "
        f"p95 {result.p95_ms:.2f}  p99 {result.p99_ms:.2f}  std {result.std_ms:.2f}",
    ]
    for sample in result.error_samples:
        lines.append(f"  error: {sample}")
    if result.server:
        header = ("MODEL", "REQ", "EXEC", "AVG_BATCH", "REQ_MS", "QUEUE_MS", "IN_MS", "INFER_MS")
        rows = [header + ("OUT_MS",)]
        for s in result.server:
            rows.append(
                (
                    s.name,
                    str(s.success_count),
                    str(s.execution_count),
                    f"{s.avg_batch_size:.1f}",
                    f"{s.avg_request_ms:.2f}",
                    f"{s.avg_queue_ms:.2f}",
                    f"{s.avg_compute_input_ms:.2f}",
                    f"{s.avg_compute_infer_ms:.2f}",
                    f"{s.avg_compute_output_ms:.2f}",
                )
            )
        widths = [max(len(r[i]) for r in rows) for i in range(len(header) + 1)]
        lines.append("  server side (this window):")
        lines += [
            "    " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows
        ]
    return "\n".join(line.rstrip() for line in lines)


def run_triton_load(
    url: str,
    protocol: str,
    model: str,
    input_name: str,
    requests: Sequence[Sequence[bytes]],
    spec: LoadSpec,
    label: str | None = None,
    factory: SenderFactory | None = None,
) -> LoadResult:
    """:func:`run_load` against a Triton ensemble, with the window's server-side times.

    ``factory`` replaces the default one-input :class:`TritonSender` (e.g. for an
    ensemble of two inputs); ``input_name`` is then unused.
    """
    from . import server_stats  # noqa: PLC0415 - keeps the peer-only path light

    order = server_stats.ensemble_order(url, protocol, model)
    before: dict[str, server_stats.Snapshot] = {}

    def mark() -> None:
        before["stats"] = server_stats.snapshot(url, protocol)

    if factory is None:

        def factory() -> TritonSender:
            return TritonSender(url, model, input_name, protocol)

    result = run_load(factory, requests, spec, label, mark)
    after = server_stats.snapshot(url, protocol)
    result.server = server_stats.window_stats(before.get("stats", {}), after, order)
    return result
