"""The loads of ``bench.faults.overload`` and the open loop that sends them over gRPC.

Three loads (:data:`LOADS`), each a fixed list of distinct requests cycled by the loop:

- ``text1``: one sentence per request to the text ensemble;
- ``text32``: 32 consecutive pool sentences per request (the pool covered uniformly);
- ``images``: one real photograph per request, as encoded JPEG bytes, to the CLIP image
  ensemble ``<clip>_image`` (scikit-image's bundled photos, encoded once).

Every answer is checked against reference rows: each sentence (``text1`` and ``text32``)
and each photo sent once, alone, before any load.
"""

from __future__ import annotations

import io
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

from bench.faults.overload_figures import Shot
from bench.manifest import TEXT_MODEL
from embed_runtime.serving.admission import DEADLINE_PARAMETER

OUTPUT = "EMBEDDING"
LOADS = ("text1", "text32", "images")
TEXT_ROWS = 32
# A closed loop of 32-row requests saturates the server with a quarter of the clients
# (``make bench``'s 4 x 32); 32 such clients only queue, and each request takes seconds.
MULTI_ROW_CLIENT_SHARE = 4
# scikit-image's bundled photographs (no download); ``camera`` is greyscale.
PHOTOS = (
    "astronaut",
    "coffee",
    "chelsea",
    "rocket",
    "hubble_deep_field",
    "immunohistochemistry",
    "retina",
    "camera",
)
JPEG_QUALITY = 90
DRAIN_S = 5.0


def photos(names: Sequence[str] = PHOTOS) -> dict[str, bytes]:
    """Each photo of ``names`` as RGB JPEG bytes (name -> bytes)."""
    try:
        from skimage import data
    except ImportError as exc:
        raise SystemExit(
            "the images load needs scikit-image (pip install scikit-image), "
            "or leave it out: --load text1,text32"
        ) from exc
    from PIL import Image

    out = {}
    for name in names:
        buf = io.BytesIO()
        Image.fromarray(getattr(data, name)()).convert("RGB").save(
            buf, format="JPEG", quality=JPEG_QUALITY
        )
        out[name] = buf.getvalue()
    return out


@dataclass
class Load:
    """One load: the model and input it sends to, its distinct requests, their reference rows.

    ``rows[k]`` indexes the reference matrix of ``source`` (``text`` or ``images``) for
    every row of request ``k``.
    """

    name: str
    model: str
    input_name: str
    source: str
    requests: list[list[bytes]]
    rows: list[list[int]]
    inputs: list[Any] = field(default_factory=list, repr=False)

    @property
    def base(self) -> str:
        """The served model whose steps this load reaches (``all-MiniLM-L6-v2``, ``clip-tiny``)."""
        return self.model.removesuffix("_image")

    def closed_loop_clients(self, clients: Sequence[int]) -> list[int]:
        """The concurrencies to measure this load's sustainable rate at (fewer for many rows)."""
        if len(self.requests[0]) == 1:
            return list(clients)
        return sorted({max(1, c // MULTI_ROW_CLIENT_SHARE) for c in clients})

    def prepare(self) -> None:
        """Build each request's gRPC ``InferInput`` once."""
        import tritonclient.grpc as grpcclient

        self.inputs = []
        for request in self.requests:
            item = grpcclient.InferInput(self.input_name, [len(request), 1], "BYTES")
            item.set_data_from_numpy(np.array([[r] for r in request], dtype=object))
            self.inputs.append(item)


def make_loads(
    names: Sequence[str], sentences: Sequence[str], clip: str, images: Sequence[bytes] = ()
) -> list[Load]:
    """The loads ``names`` over the sentence pool and the encoded ``images``."""
    encoded = [s.encode() for s in sentences]
    count = len(encoded)
    groups = [
        [(k * TEXT_ROWS + j) % count for j in range(TEXT_ROWS)]
        for k in range(max(count // TEXT_ROWS, 1))
    ]
    built = {
        "text1": lambda: Load(
            "text1", TEXT_MODEL, "TEXT", "text", [[t] for t in encoded], [[i] for i in range(count)]
        ),
        "text32": lambda: Load(
            "text32", TEXT_MODEL, "TEXT", "text", [[encoded[i] for i in g] for g in groups], groups
        ),
        "images": lambda: Load(
            "images",
            f"{clip}_image",
            "IMAGE",
            "images",
            [[b] for b in images],
            [[i] for i in range(len(images))],
        ),
    }
    return [built[name]() for name in names]


def expected_rows(matrix: np.ndarray, rows: Sequence[Sequence[int]], item: int) -> np.ndarray:
    """The reference rows of request ``item``: ``matrix[rows[item]]``."""
    return matrix[list(rows[item])]


def references(
    url: str, loads: Sequence[Load], sentences: Sequence[str], images: Sequence[bytes]
) -> dict[str, np.ndarray]:
    """The reference matrix of every source the loads use: each row sent once, alone."""
    import tritonclient.grpc as grpcclient

    sources = {load.source: load for load in loads}
    rows = {"text": [s.encode() for s in sentences], "images": list(images)}
    client = grpcclient.InferenceServerClient(url)
    out = {}
    try:
        for source, load in sources.items():
            vectors = []
            for row in rows[source]:
                item = grpcclient.InferInput(load.input_name, [1, 1], "BYTES")
                item.set_data_from_numpy(np.array([[row]], dtype=object))
                model = TEXT_MODEL if source == "text" else load.model
                result = client.infer(model, [item], client_timeout=120.0)
                vectors.append(result.as_numpy(OUTPUT)[0])
            out[source] = np.stack(vectors)
    finally:
        client.close()
    return out


def plan(rate: float, seconds: float, requests: int, seed: int, start: float) -> list[Shot]:
    """Poisson arrivals at ``rate``/s for ``seconds`` from ``start``, each a random request."""
    rng = np.random.default_rng(seed)
    count = max(int(rate * seconds), 1)
    gaps = rng.exponential(1.0 / rate, count)
    picks = rng.integers(0, requests, count)
    times = start + np.cumsum(gaps) - gaps[0]
    return [Shot(int(i), float(t)) for i, t in zip(picks, times, strict=True)]


def deadline_parameters(deadline_s: float, wall: Callable[[], float] = time.time) -> dict[str, int]:
    """The request parameter that carries the client deadline: absolute, µs since the epoch."""
    return {DEADLINE_PARAMETER: int((wall() + deadline_s) * 1e6)}


def _answered(shot: Shot, clock: Callable[[], float], result: Any, error: Any) -> None:
    """The ``async_infer`` callback (runs on a gRPC thread)."""
    status = "" if error is None else f"{error.status()}: {error.message()}"
    shot.answer(None if result is None else result.as_numpy(OUTPUT), status, clock())


def open_loop(
    url: str,
    load: Load,
    rate: float,
    seconds: float,
    deadline_s: float,
    senders: int,
    seed: int,
    send_deadline: bool = True,
    clock: Callable[[], float] = time.perf_counter,
) -> tuple[list[Shot], float]:
    """Poisson arrivals of ``load`` at ``rate``/s for ``seconds``, over ``senders`` threads.

    Each thread has its own gRPC channel and sends its share with ``async_infer`` (never
    waiting for an answer), the deadline as ``client_timeout`` and, with
    ``send_deadline``, as the request parameter. Waits for every answer, at most
    ``deadline_s`` + 5 s after the last send. Returns the shots and the wall time from the
    first planned arrival to the last send.
    """
    import tritonclient.grpc as grpcclient

    if not load.inputs:
        load.prepare()
    shots = plan(rate, seconds, len(load.inputs), seed, clock() + 0.2)
    clients = [grpcclient.InferenceServerClient(url) for _ in range(senders)]

    def send(index: int) -> None:
        client = clients[index]
        for shot in shots[index::senders]:
            wait = shot.planned - clock()
            if wait > 0:
                time.sleep(wait)
            shot.sent = clock()
            client.async_infer(
                load.model,
                [load.inputs[shot.item]],
                partial(_answered, shot, clock),
                client_timeout=deadline_s,
                parameters=deadline_parameters(deadline_s) if send_deadline else None,
            )

    threads = [threading.Thread(target=send, args=(i,), daemon=True) for i in range(senders)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    sent_s = max(s.sent for s in shots) - shots[0].planned
    limit = clock() + deadline_s + DRAIN_S
    while any(not s.done for s in shots) and clock() < limit:
        time.sleep(0.05)
    for client in clients:
        client.close()
    return shots, sent_s
