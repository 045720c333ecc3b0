"""Shared helpers of the integration tests: raw requests, concurrent requests and rounds,
statistics deltas."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from client import ModelStats
from tests.integration.conftest import TEXT_MODEL

# Measured here (220 texts, HTTP and gRPC): 1 - cos 1.3e-12 (float64), max abs 2.4e-7.
# 1 - cos grows with the square of the difference, so ~30x on the values is ~900x on it.
MAX_ONE_MINUS_COS = 1e-9
MAX_ABS_DIFF = 1e-5
PROTOCOLS = ["http", "grpc"]
INVALID = {"http": "400", "grpc": "StatusCode.INVALID_ARGUMENT"}
_MODULES = {"http": httpclient, "grpc": grpcclient}


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine similarity, computed in float64 (float32 rounds near 1)."""
    a, b = a.astype(np.float64), b.astype(np.float64)
    return np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def assert_parity(got: np.ndarray, want: np.ndarray) -> tuple[float, float]:
    """Assert ``got`` equals ``want`` within the parity gates; returns (1 - min cos, max abs)."""
    assert got.shape == want.shape, (got.shape, want.shape)
    gap = float(1.0 - cosines(got, want).min())
    diff = float(np.abs(got.astype(np.float64) - want).max())
    assert gap <= MAX_ONE_MINUS_COS, f"1 - min cosine {gap:.2e} > {MAX_ONE_MINUS_COS:.0e}"
    assert diff <= MAX_ABS_DIFF, f"max abs diff {diff:.2e} > {MAX_ABS_DIFF:.0e}"
    return gap, diff


def assert_row_parity(got: np.ndarray, want: np.ndarray) -> None:
    """:func:`assert_parity` of one embedding row."""
    assert_parity(got[None], want[None])


def assert_framework_parity(
    label: str,
    want: Callable[[Sequence[str]], np.ndarray],
    texts: Sequence[str],
    embed_documents: Callable,
    embed_query: Callable | None = None,
    query: str = "",
) -> None:
    """A framework's vectors of ``texts`` (and of ``query``) equal to ``want``'s; gap printed."""
    gap, diff = assert_parity(np.asarray(embed_documents(texts), dtype=np.float32), want(texts))
    print(f"\n{label}: 1-cos {gap:.1e}, max|diff| {diff:.1e}")
    if embed_query is not None:
        assert_parity(np.asarray(embed_query(query), dtype=np.float32)[None], want([query]))


def langchain_openai_embeddings(base_url: str, api_key: str, model: str, chunk_size: int):
    """LangChain's ``OpenAIEmbeddings`` of the OpenAI API at ``base_url``: whole texts, no retry."""
    from langchain_openai import OpenAIEmbeddings

    return OpenAIEmbeddings(
        model=model,
        base_url=base_url,
        api_key=api_key,
        check_embedding_ctx_length=False,
        chunk_size=chunk_size,
        max_retries=0,
    )


def raw_client(server, protocol: str):
    """A plain tritonclient ``InferenceServerClient`` (no admin key)."""
    return _MODULES[protocol].InferenceServerClient(server.url(protocol))


def text_tensor(rows: Sequence[str | bytes]) -> np.ndarray:
    """A ``[N, 1]`` BYTES array; ``str`` rows are UTF-8 encoded, ``bytes`` sent as they are."""
    items = [r.encode("utf-8") if isinstance(r, str) else r for r in rows]
    return np.array(items, dtype=np.object_).reshape(-1, 1)


def infer_raw(
    tc,
    protocol: str,
    array: np.ndarray,
    name: str = "TEXT",
    dtype: str = "BYTES",
    model: str = TEXT_MODEL,
) -> np.ndarray:
    """Send ``array`` as input ``name`` to ``model``; returns ``EMBEDDING``."""
    module = _MODULES[protocol]
    inp = module.InferInput(name, list(array.shape), dtype)
    inp.set_data_from_numpy(array)
    return tc.infer(model, [inp]).as_numpy("EMBEDDING")


def bytes_inputs(protocol: str, inputs: Mapping[str, Sequence[str | bytes]]) -> list:
    """``InferInput`` of ``protocol`` for each of ``inputs`` (name: rows), a ``[N, 1]``
    BYTES tensor of its rows (:func:`text_tensor`)."""
    module = _MODULES[protocol]
    items = []
    for name, rows in inputs.items():
        array = text_tensor(rows)
        item = module.InferInput(name, list(array.shape), "BYTES")
        item.set_data_from_numpy(array)
        items.append(item)
    return items


def infer(
    server,
    protocol: str,
    model: str,
    inputs: Mapping[str, Sequence[str | bytes]],
    outputs: Sequence[str],
    parameters: dict | None = None,
) -> tuple[np.ndarray, ...]:
    """One raw request, each of ``inputs`` (name: rows) a ``[N, 1]`` BYTES tensor of its
    rows (:func:`text_tensor`); returns the arrays of ``outputs``, in that order."""
    tc = raw_client(server, protocol)
    try:
        items = bytes_inputs(protocol, inputs)
        result = tc.infer(model, items, parameters=parameters or None)
        return tuple(result.as_numpy(name) for name in outputs)
    finally:
        tc.close()


def plain_request_outputs(
    server, protocol: str, model: str, inputs: Mapping[str, Sequence[str]]
) -> dict[str, list[int]]:
    """What a request that names no output gets: output name -> shape, in answer order.

    HTTP: the README's raw JSON body, with no ``outputs`` key; gRPC: tritonclient with
    ``outputs=None``. Each of ``inputs`` (name: rows) is a ``[N, 1]`` BYTES tensor.
    """
    if protocol == "http":
        import json
        import urllib.error
        import urllib.request

        body = {"inputs": [
            {"name": name, "datatype": "BYTES", "shape": [len(rows), 1], "data": list(rows)}
            for name, rows in inputs.items()
        ]}
        request = urllib.request.Request(
            f"http://{server.http_url}/v2/models/{model}/infer", json.dumps(body).encode()
        )
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                answer = json.loads(response.read())
        except urllib.error.HTTPError as exc:
            raise RuntimeError(f"HTTP {exc.code}: {exc.read().decode(errors='replace')}") from exc
        return {o["name"]: o["shape"] for o in answer["outputs"]}
    tc = raw_client(server, "grpc")
    try:
        answer = tc.infer(model, bytes_inputs("grpc", inputs)).get_response()
        return {o.name: list(o.shape) for o in answer.outputs}
    finally:
        tc.close()


def concurrently(calls: Sequence[Callable[[], object]]) -> list:
    """Run each call on its own thread, all released at once by a barrier.

    Returns each call's result, or the ``InferenceServerException`` it raised.
    """
    barrier = threading.Barrier(len(calls))

    def run(call: Callable[[], object]) -> object:
        barrier.wait()
        try:
            return call()
        except InferenceServerException as exc:
            return exc

    with ThreadPoolExecutor(len(calls)) as pool:
        return list(pool.map(run, calls))


def refusal(server, protocol: str, array: np.ndarray, **kwargs) -> tuple[str, str]:
    """``(status, message)`` of the error a raw request gets; fails if it succeeds."""
    tc = raw_client(server, protocol)
    try:
        infer_raw(tc, protocol, array, **kwargs)
    except InferenceServerException as exc:
        return str(exc.status()), str(exc.message())
    finally:
        tc.close()
    raise AssertionError("the request was expected to fail but succeeded")


def model_stats(server, model: str) -> ModelStats:
    """Triton's statistics of ``model`` (version 1)."""
    with server.client() as c:
        (stats,) = [s for s in c.model_statistics(model) if s.name == model]
    return stats


@dataclass(frozen=True)
class StatsDelta:
    """What one model did between two statistics snapshots."""

    inferences: int
    executions: int
    batch_sizes: dict[int, int]

    @property
    def largest_batch(self) -> int:
        """The largest batch size that ran at least once (0: none)."""
        return max((size for size, n in self.batch_sizes.items() if n > 0), default=0)


def wait_stats(
    server, model: str, before: ModelStats, inferences: int, timeout_s: float = 10.0
) -> StatsDelta:
    """Poll until ``model`` counted ``inferences`` more rows than ``before``; the delta.

    Statistics are reported after the responses are sent, so they can lag a little.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        after = model_stats(server, model)
        done = after.inference_count - before.inference_count
        if done >= inferences or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    sizes = {
        size: count - before.batch_sizes.get(size, 0)
        for size, count in after.batch_sizes.items()
        if count != before.batch_sizes.get(size, 0)
    }
    return StatsDelta(done, after.execution_count - before.execution_count, sizes)


def protocol_of(i: int) -> str:
    """The protocol :func:`concurrent_round` sends request ``i`` over."""
    return "http" if i % 2 == 0 else "grpc"


def concurrent_round(server, payloads: Sequence[str | bytes], model: str = TEXT_MODEL) -> list:
    """Send each payload as its own one-row request, all released at once by a barrier.

    Requests alternate between HTTP and gRPC, each from its own thread on a client that
    thread connected beforehand (HTTP clients are bound to their thread). Returns each
    request's ``EMBEDDING`` row or the exception it raised.
    """
    barrier = threading.Barrier(len(payloads))
    results: list = [None] * len(payloads)

    def send(i: int) -> None:
        protocol = protocol_of(i)
        tc = raw_client(server, protocol)
        try:
            tc.is_server_live()
            barrier.wait()
            results[i] = infer_raw(tc, protocol, text_tensor([payloads[i]]), model=model)[0]
        except Exception as exc:
            results[i] = exc
        finally:
            tc.close()

    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(payloads))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def assert_bad_requests_fail_alone(
    server,
    step: str,
    payloads: Sequence[str | bytes],
    want: Mapping[str | bytes, np.ndarray],
    bad: Mapping[str | bytes, str],
    check: Callable[[np.ndarray, np.ndarray], object] = assert_row_parity,
    model: str = TEXT_MODEL,
) -> None:
    """Good and bad one-row requests reach ``step`` of ``model`` together; each gets its own answer.

    Rounds of :func:`concurrent_round`: each good payload's row passes ``check(row,
    want[payload])``, each bad one is refused with INVALID_ARG and ``bad[payload]``, and
    ``step`` counts every request. An execution of ``step`` with more requests than there
    are good ones, or bad ones, must have held both: the statistics show it, or the round
    is repeated (8 rounds at most).
    """
    mixed = max(sum(p in want for p in payloads), sum(p in bad for p in payloads))
    prefix = f"in ensemble '{model}', "
    rounds = []
    for _ in range(8):
        before = model_stats(server, step)
        results = concurrent_round(server, payloads, model=model)
        delta = wait_stats(server, step, before, len(payloads))
        for i, (payload, result) in enumerate(zip(payloads, results, strict=True)):
            if payload in want:
                assert isinstance(result, np.ndarray), f"{payload!r} failed: {result}"
                check(result, want[payload])
            else:
                got = (str(result.status()), str(result.message()))
                assert got == (INVALID[protocol_of(i)], prefix + bad[payload])
        assert delta.inferences == len(payloads), delta
        rounds.append(delta.batch_sizes)
        if delta.largest_batch > mixed:
            break
    print(f"\n{step} executions by batch size, per round: {rounds}")
    assert delta.largest_batch > mixed, (
        f"no {step} execution mixed good and bad requests in {len(rounds)} rounds: {rounds}"
    )
