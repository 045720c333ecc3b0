"""Deadlines and retries of the client (``client.retry``, ``client.deadline``), no server.

A fake tritonclient answers from a script with real ``InferenceServerException`` s of
the statuses Triton gives; a fake clock moves only when the fake server works or the
client sleeps, so every bound is checked exactly.
"""

from __future__ import annotations

import random
import socket
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException, deserialize_bytes_tensor

from client import (
    DEADLINE_PARAMETER,
    DeadlineExceededError,
    EmbeddingClient,
    EmbeddingClientError,
    RetryBudget,
    RetryPolicy,
    ServerOverloadedError,
    thread_client,
)
from client.deadline import Deadline, with_deadline
from client.retry import Failure, classify

QUEUE_FULL = ("503", "Exceeds maximum queue size")
REFUSALS = [
    QUEUE_FULL,
    ("StatusCode.UNAVAILABLE", "Exceeds maximum queue size"),
    ("503", "Request timeout expired"),
    ("StatusCode.UNAVAILABLE", "Request timeout expired"),
    ("429", "Too many requests"),
    ("StatusCode.RESOURCE_EXHAUSTED", "rate limited"),
    (
        "StatusCode.UNAVAILABLE",
        "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:1: "
        "Failed to connect to remote host: Connection refused",
    ),
    ("StatusCode.UNAVAILABLE", "Socket closed"),
    ("StatusCode.UNAVAILABLE", "recvmsg:Connection reset by peer"),
]
FINAL_ANSWERS = [
    ("400", "unexpected shape for input 'TEXT' for model 'm'"),
    ("StatusCode.INVALID_ARGUMENT", "in ensemble 'm', TEXT row 1 is empty or whitespace only"),
    ("StatusCode.NOT_FOUND", "Request for unknown model: 'm' is not found"),
    ("500", "Stub process 'm_encode_0_0' is not healthy."),
    ("503", "cannot fetch http://127.0.0.1:9/x.jpg: connection to 127.0.0.1:9 refused"),
    ("StatusCode.UNAVAILABLE", "This API is restricted, expecting header 'x-admin-key'"),
    ("StatusCode.UNAVAILABLE", "IMAGE_URL 'http://h/x.jpg' unavailable: connection reset"),
    ("503", "IMAGE_URL 'http://h/x.jpg' unavailable: connection closed without a response"),
    ("503", "model_manager is disabled: the server has no admin key"),
]
DEADLINE_ANSWERS = [
    (
        "StatusCode.UNAVAILABLE",
        "deadline passed 3.0 ms before this step ran (request parameter deadline_unix_us)",
    ),
    ("503", "request cancelled: its client closed the connection or passed its deadline"),
    ("StatusCode.DEADLINE_EXCEEDED", "Deadline Exceeded"),
]


class FakeTime:
    """A monotonic clock, a wall clock and a sleep that move only when told."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    def wall(self) -> float:
        return 1_800_000_000.0 + self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds

    def policy(self, seed: int = 0, **options) -> RetryPolicy:
        rng = random.Random(seed)
        return RetryPolicy(
            clock=self.clock, wall_clock=self.wall, sleep=self.sleep, random=rng.random, **options
        )


def _texts_of(infer_input) -> list[bytes]:
    raw = getattr(infer_input, "_raw_content", None) or infer_input._raw_data  # grpc / http
    return list(deserialize_bytes_tensor(raw))


def vector(text: bytes) -> list[float]:
    """The fake server's embedding of ``text``."""
    return [float(len(text)), float(sum(text) % 97), 1.0, -1.0]


class FakeTriton:
    """tritonclient's client: ``answer(n, texts)`` gives request n's error (None: served).

    Each request costs ``cost_s`` of fake time; everything sent is recorded.
    """

    def __init__(self, clock: FakeTime, answer, cost_s: float = 0.001, max_batch: int = 0):
        self.clock, self.answer, self.cost_s, self.max_batch = clock, answer, cost_s, max_batch
        self.sent: list[SimpleNamespace] = []

    def infer(self, model, inputs, outputs=None, parameters=None, **kwargs):
        texts = _texts_of(inputs[-1])
        self.sent.append(
            SimpleNamespace(texts=texts, parameters=parameters, kwargs=kwargs, at=self.clock.now)
        )
        self.clock.now += self.cost_s
        error = self.answer(len(self.sent), texts)
        if error is not None:
            raise error
        rows = np.array([vector(t) for t in texts], dtype=np.float32)
        outputs = {
            "EMBEDDING": rows,
            "SCORE": rows[:, :1],
            "SPARSE_INDICES": np.tile(np.arange(4, dtype=np.int32), (len(texts), 1)),
            "SPARSE_VALUES": rows,
        }
        return SimpleNamespace(as_numpy=outputs.get)

    def get_model_config(self, model, **kwargs):
        return {"config": {"name": model, "max_batch_size": str(self.max_batch)}}

    def close(self) -> None:
        pass


def refuse(status: str, message: str, times: int | None = None):
    """An answer that refuses the first ``times`` requests (all when None)."""

    def answer(n: int, _texts) -> Exception | None:
        if times is None or n <= times:
            return InferenceServerException(message, status=status)
        return None

    return answer


def _client(
    clock: FakeTime,
    answer,
    protocol: str = "grpc",
    timeout_s: float = 60.0,
    max_batch: int = 0,
    **options,
) -> tuple[EmbeddingClient, FakeTriton]:
    options.setdefault("retry", clock.policy())
    client = EmbeddingClient("127.0.0.1:1", protocol, timeout_s, admin_key="", **options)
    client._client.close()
    fake = FakeTriton(clock, answer, max_batch=max_batch)
    client._client = fake
    client._max_batch["m"] = max_batch  # as read from the config (tests that read it drop it)
    return client, fake


# --- backoff -------------------------------------------------------------------------------


def test_backoff_is_a_full_jitter_draw_under_base_times_two_to_the_n_capped() -> None:
    top = RetryPolicy(base_s=0.05, cap_s=2.0, random=lambda: 1.0)
    assert [top.backoff_s(n) for n in range(1, 8)] == [0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 2.0]
    assert RetryPolicy(random=lambda: 0.0).backoff_s(5) == 0.0
    drawn = RetryPolicy(random=random.Random(1).random)
    for n in range(1, 12):
        delays = [drawn.backoff_s(n) for _ in range(200)]
        bound = min(2.0, 0.05 * 2 ** (n - 1))
        assert 0.0 <= min(delays) and max(delays) <= bound
        assert max(delays) > 0.8 * bound  # spread over the whole range, not a fixed step


# --- what is retried ---------------------------------------------------------------------


@pytest.mark.parametrize(("status", "message"), REFUSALS)
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_refused_request_is_retried_and_returns_the_exact_vectors(protocol, status, message):
    clock = FakeTime()
    client, fake = _client(clock, refuse(status, message, times=2), protocol)
    got = client.embed_texts("m", ["a cat", "a dog"])
    np.testing.assert_array_equal(got, [vector(b"a cat"), vector(b"a dog")])
    assert len(fake.sent) == 3 and len(clock.sleeps) == 2
    assert clock.sleeps[0] <= 0.05 and clock.sleeps[1] <= 0.1
    assert (client.retry_budget.requests, client.retry_budget.retries) == (1, 2)


@pytest.mark.parametrize(
    "error",
    [
        ConnectionRefusedError(111, "Connection refused"),
        ConnectionResetError(104, "Connection reset by peer"),
    ],
)
def test_an_unreachable_server_is_retried_like_a_refusal(error) -> None:
    clock = FakeTime()
    client, fake = _client(clock, lambda n, _t: error if n == 1 else None, "http")
    np.testing.assert_array_equal(client.embed_texts("m", ["x"]), [vector(b"x")])
    assert len(fake.sent) == 2


@pytest.mark.parametrize(("status", "message"), FINAL_ANSWERS)
def test_other_answers_raise_at_once_without_a_retry(status, message) -> None:
    clock = FakeTime()
    client, fake = _client(clock, refuse(status, message))
    with pytest.raises(EmbeddingClientError) as info:
        client.embed_texts("m", ["x"])
    assert type(info.value) is EmbeddingClientError
    assert (info.value.message, info.value.status, info.value.model) == (message, status, "m")
    assert len(fake.sent) == 1 and clock.sleeps == []


@pytest.mark.parametrize(("status", "message"), DEADLINE_ANSWERS)
def test_a_deadline_answer_raises_deadline_exceeded_without_a_retry(status, message) -> None:
    clock = FakeTime()
    client, fake = _client(clock, refuse(status, message))
    with pytest.raises(DeadlineExceededError, match="deadline of 60 s passed") as info:
        client.embed_texts("m", ["x"])
    assert message in info.value.message and info.value.status == status
    assert len(fake.sent) == 1 and clock.sleeps == []


def test_a_transport_timeout_is_the_deadline_not_an_unreachable_server() -> None:
    clock = FakeTime()
    client, fake = _client(clock, lambda n, _t: TimeoutError("timed out"), "http")
    with pytest.raises(DeadlineExceededError):
        client.embed_texts("m", ["x"])
    assert len(fake.sent) == 1


def test_classify_reads_the_cause_before_the_status() -> None:
    unreachable = EmbeddingClientError("cannot reach Triton")
    unreachable.__cause__ = ConnectionRefusedError()
    timed_out = EmbeddingClientError("cannot reach Triton")
    timed_out.__cause__ = TimeoutError()
    assert classify(unreachable) is Failure.UNREACHABLE
    assert classify(timed_out) is Failure.DEADLINE
    assert classify(EmbeddingClientError("local problem")) is Failure.FINAL


# --- the deadline ------------------------------------------------------------------------


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_retries_never_sleep_or_send_past_the_deadline(protocol) -> None:
    for seed in range(20):
        clock = FakeTime()
        client, fake = _client(
            clock,
            refuse(*QUEUE_FULL),
            protocol,
            timeout_s=1.0,
            retry=clock.policy(seed),
            retry_budget=RetryBudget(burst=1e9),
        )
        with pytest.raises(ServerOverloadedError) as info:
            client.embed_texts("m", ["x"])
        assert clock.now <= 1.0
        assert all(sent.at < 1.0 - 0.01 for sent in fake.sent[1:])  # min_attempt_s before it
        if protocol == "grpc":  # each attempt's gRPC deadline is the time left
            assert [s.kwargs["client_timeout"] for s in fake.sent] == pytest.approx(
                [1.0 - s.at for s in fake.sent]
            )
        message = info.value.message
        assert message.startswith(f"server overloaded: {len(fake.sent)} attempts in ")
        assert "the deadline (1 s) leaves no time for another attempt" in message
        assert message.endswith("last refusal: Exceeds maximum queue size")
        assert info.value.attempts == len(fake.sent) and info.value.status == "503"
        assert info.value.last_error.message == QUEUE_FULL[1]


def test_the_deadline_covers_the_whole_call_across_its_split_requests() -> None:
    """5 texts, max_batch_size 2: three requests, each sent with the time left, and one
    absolute deadline; a call whose time is gone before a request raises at once."""
    clock = FakeTime()
    client, fake = _client(clock, lambda n, _t: None, timeout_s=1.0, max_batch=2)
    fake.cost_s = 0.3
    got = client.embed_texts("m", ["a", "bb", "ccc", "dddd", "eeeee"])
    assert got.shape == (5, 4) and [len(s.texts) for s in fake.sent] == [2, 2, 1]
    assert [s.kwargs["client_timeout"] for s in fake.sent] == pytest.approx([1.0, 0.7, 0.4])
    assert {s.parameters[DEADLINE_PARAMETER] for s in fake.sent} == {1_800_000_001_000_000}
    fake.cost_s = 0.5
    with pytest.raises(DeadlineExceededError, match="passed before the request was sent"):
        client.embed_texts("m", ["a", "bb", "ccc", "dddd", "eeeee"])
    assert len(fake.sent) == 5  # 3 + the two that fitted in 1 s


def test_each_call_gets_a_fresh_deadline() -> None:
    clock = FakeTime()
    client, fake = _client(clock, lambda n, _t: None, timeout_s=1.0)
    fake.cost_s = 0.6
    client.embed_texts("m", ["a"])
    client.embed_texts("m", ["b"])
    assert [s.kwargs["client_timeout"] for s in fake.sent] == pytest.approx([1.0, 1.0])


# --- the budget ----------------------------------------------------------------------------


def test_a_spent_budget_raises_server_overloaded_naming_attempts_and_the_refusal() -> None:
    clock = FakeTime()
    budget = RetryBudget(ratio=0.0, min_per_s=0.0, burst=2.0, clock=clock.clock)
    client, fake = _client(clock, refuse(*QUEUE_FULL), retry_budget=budget)
    with pytest.raises(ServerOverloadedError) as info:
        client.embed_texts("m", ["x"])
    assert len(fake.sent) == 3 and info.value.attempts == 3
    assert str(info.value).startswith("model 'm': server overloaded: 3 attempts in ")
    assert "the retry budget is spent; last refusal: Exceeds maximum queue size" in str(info.value)
    assert (budget.retries, budget.denied) == (2, 1)


def test_retry_none_sends_once_and_says_retries_are_off() -> None:
    clock = FakeTime()
    client, fake = _client(clock, refuse(*QUEUE_FULL), retry=None)
    with pytest.raises(ServerOverloadedError, match="server overloaded: 1 attempt in .* retries"):
        client.embed_texts("m", ["x"])
    assert len(fake.sent) == 1


@pytest.mark.parametrize(("floor", "attempt_s"), [(1.0, 0.001), (1.0, 0.02), (0.0, 0.001)])
def test_under_sustained_refusals_retries_stay_within_ten_percent_plus_the_floor(
    floor, attempt_s
) -> None:
    """10,000 calls against a server that refuses everything, one client: retries <=
    0.1 x requests + burst + floor x elapsed seconds, and the budget is used, not idle."""
    clock = FakeTime()
    budget = RetryBudget(min_per_s=floor, clock=clock.clock)
    client, fake = _client(clock, refuse(*QUEUE_FULL), retry_budget=budget)
    fake.cost_s = attempt_s
    calls = 10_000
    for _ in range(calls):
        with pytest.raises(ServerOverloadedError):
            client.embed_texts("m", ["x"])
    retries = len(fake.sent) - calls
    bound = 0.1 * calls + budget.burst + floor * clock.now
    print(
        f"\nfloor {floor}/s, {attempt_s * 1000:g} ms a refusal: {retries} retries for "
        f"{calls} requests ({retries / calls:.1%}) in {clock.now:.1f} s; bound {bound:.0f}"
    )
    assert (budget.requests, budget.retries) == (calls, retries)
    assert retries <= bound
    assert retries >= 0.95 * (0.1 * calls)  # the 10 % are there to be used


def test_threads_sharing_a_budget_stay_within_it() -> None:
    budget = RetryBudget(min_per_s=0.0)
    policy = RetryPolicy(sleep=lambda _s: None)
    counts: list[int] = []

    def worker() -> None:
        clock = FakeTime()
        client, fake = _client(clock, refuse(*QUEUE_FULL), retry=policy, retry_budget=budget)
        for _ in range(500):
            with pytest.raises(ServerOverloadedError):
                client.embed_texts("m", ["x"])
        counts.append(len(fake.sent))

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert budget.requests == 4000 and sum(counts) - 4000 == budget.retries
    assert budget.retries <= 0.1 * 4000 + budget.burst


# --- parameters ----------------------------------------------------------------------------


def test_the_deadline_parameter_joins_the_caller_s_parameters() -> None:
    clock = FakeTime()
    client, fake = _client(clock, lambda n, _t: None, timeout_s=2.5)
    client.embed_texts("m", ["a"], prompt_name="query", dimensions=8)
    client.embed_sparse("m", ["a"], task="query")
    client.rerank("m", "q", ["a"])
    client.embed_texts("m", ["a"])
    deadline = 1_800_000_002_500_000
    assert [s.parameters for s in fake.sent[:1]] == [
        {DEADLINE_PARAMETER: deadline, "prompt_name": "query", "dimensions": 8}
    ]
    assert fake.sent[1].parameters[DEADLINE_PARAMETER] == deadline + 1_000  # 1 ms later
    assert fake.sent[1].parameters["task"] == "query"
    assert all(isinstance(s.parameters[DEADLINE_PARAMETER], int) for s in fake.sent)
    assert fake.sent[3].parameters == {DEADLINE_PARAMETER: deadline + 3_000}


def test_with_deadline_keeps_a_caller_s_own_value_and_the_server_reads_the_same_name() -> None:
    clock = FakeTime()
    deadline = Deadline(0.25, clock.clock, clock.wall)
    assert with_deadline(None, deadline) == {DEADLINE_PARAMETER: 1_800_000_000_250_000}
    assert with_deadline({DEADLINE_PARAMETER: 7, "a": 1}, deadline) == {
        DEADLINE_PARAMETER: 7,
        "a": 1,
    }
    assert DEADLINE_PARAMETER == "deadline_unix_us"
    admission = pytest.importorskip("embed_runtime.serving.admission")
    assert admission.DEADLINE_PARAMETER == DEADLINE_PARAMETER


def test_the_batch_limit_is_still_learnt_from_a_refusal() -> None:
    """Without the admin key the config is refused; Triton's batch-size answer (400, not
    retried) teaches the limit and the call is split again."""
    clock = FakeTime()

    def answer(n, texts):
        if len(texts) > 2:
            return InferenceServerException(
                "inference request batch-size must be <= 2 for 'm'", status="400"
            )
        return None

    client, fake = _client(clock, answer)

    def restricted(model, **kwargs):
        raise InferenceServerException("This API is restricted, expecting header", "403")

    fake.get_model_config = restricted
    client._max_batch.clear()
    got = client.embed_texts("m", ["a", "b", "c", "d", "e"])
    np.testing.assert_array_equal(got[4], vector(b"e"))
    assert [len(s.texts) for s in fake.sent] == [5, 2, 2, 1]
    assert client._max_batch["m"] == 2 and client.retry_budget.retries == 0


# --- a hung server -------------------------------------------------------------------------


@pytest.fixture
def hung_server():
    """A TCP server on 127.0.0.1 that accepts and never answers; records when a peer closes."""
    listener = socket.create_server(("127.0.0.1", 0))
    closed: list[float] = []
    stop = threading.Event()

    def serve() -> None:
        listener.settimeout(0.1)
        peers = []
        while not stop.is_set():
            try:
                peer, _ = listener.accept()
                peer.settimeout(0.05)
                peers.append(peer)
            except TimeoutError:
                pass
            for peer in list(peers):
                try:
                    if peer.recv(65536) == b"":
                        closed.append(time.monotonic())
                        peers.remove(peer)
                except TimeoutError:
                    pass
        for peer in peers:
            peer.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"127.0.0.1:{listener.getsockname()[1]}", closed
    stop.set()
    thread.join()
    listener.close()


HUNG_MARGIN_S = 2.5


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_hung_server_gets_no_more_time_than_the_deadline(hung_server, protocol) -> None:
    url, closed = hung_server
    with EmbeddingClient(url, protocol, timeout_s=0.5, admin_key="") as client:
        start = time.monotonic()
        # HTTP: the transport timeout ends the attempt (DeadlineExceededError); gRPC calls a
        # server that never sends its SETTINGS frame unreachable and retries it until the
        # deadline leaves no time (ServerOverloadedError). Both end within the deadline.
        with pytest.raises((DeadlineExceededError, ServerOverloadedError)) as info:
            client.embed_texts("m", ["x"])
        took = time.monotonic() - start
        print(f"\n{protocol}: {type(info.value).__name__} after {took:.3f} s: {info.value}")
    # A hung server would hold the call for good; seconds of margin for a loaded machine
    # (a clean-clone CI saw gRPC report its 0.5 s deadline after 1.07 s).
    assert took <= 0.5 + HUNG_MARGIN_S
    if protocol == "http":  # the client closed its connection: Triton cancels the request
        assert isinstance(info.value, DeadlineExceededError) and took >= 0.45
        deadline = time.monotonic() + 2 * HUNG_MARGIN_S
        while not closed and time.monotonic() < deadline:
            time.sleep(0.02)
        assert closed and closed[0] - start <= 0.5 + HUNG_MARGIN_S


# --- integrations and the CLI --------------------------------------------------------------


class _Recorder:
    made: list[dict] = []

    def __init__(self, url, protocol, timeout_s, **options):
        _Recorder.made.append({"timeout_s": timeout_s, **options})

    def embed_texts(self, model, texts, **options):
        return np.zeros((len(texts), 2), dtype=np.float32)

    def __enter__(self) -> _Recorder:
        return self

    def __exit__(self, *exc) -> None:
        pass

    def close(self) -> None:
        pass


def test_framework_classes_pass_the_deadline_and_the_policy_through(monkeypatch) -> None:
    from client.langchain import TritonEmbeddings
    from client.llama_index import TritonEmbedding

    _Recorder.made = []
    monkeypatch.setattr(thread_client, "EmbeddingClient", _Recorder)
    policy = RetryPolicy(base_s=0.01)
    TritonEmbeddings("m", timeout_s=3.0, retry=policy).embed_query("a")
    TritonEmbedding(model_name="m", timeout_s=4.0, retry=None).get_query_embedding("a")
    TritonEmbeddings("m").embed_query("a")
    first, second, default = _Recorder.made
    assert (first["timeout_s"], first["retry"]) == (3.0, policy)
    assert (second["timeout_s"], second["retry"]) == (4.0, None)
    assert (default["timeout_s"], default["retry"]) == (60.0, RetryPolicy())
    assert isinstance(first["retry_budget"], RetryBudget)


def test_a_thread_client_shares_one_budget_between_its_threads(monkeypatch) -> None:
    _Recorder.made = []
    monkeypatch.setattr(thread_client, "EmbeddingClient", _Recorder)
    shared = thread_client.ThreadClient(None, "http", 1.0, None)
    shared.call("embed_texts", "m", ["a"])
    worker = threading.Thread(target=lambda: shared.call("embed_texts", "m", ["b"]))
    worker.start()
    worker.join()
    assert len(_Recorder.made) == 2
    assert _Recorder.made[0]["retry_budget"] is _Recorder.made[1]["retry_budget"]


@pytest.mark.parametrize(("argv", "retry"), [([], RetryPolicy()), (["--no-retry"], None)])
def test_cli_retries_by_default_and_takes_no_retry_and_the_timeout(monkeypatch, argv, retry):
    from client import cli

    made: list[dict] = []

    class Fake(_Recorder):
        def __init__(self, url, protocol, timeout_s, **options):
            made.append({"timeout_s": timeout_s, **options})

    monkeypatch.setattr(cli, "EmbeddingClient", Fake)
    assert cli.main(["embed", "--model", "m", "a", "--timeout", "7", *argv], environ={}) == 0
    assert (made[0]["timeout_s"], made[0]["retry"]) == (7.0, retry)
