"""The gateway's app (deploy/gateway/openai_gateway.py) driven over ASGI, no server.

What needs no Triton: the bound on requests in progress, the client's timeout, and how
Triton's refusals become OpenAI errors. Everything else runs against a real Triton and a
real uvicorn in tests/integration/test_gateway.py.
"""

from __future__ import annotations

import asyncio
import http.server
import importlib.util
import json
import sys
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
_spec = importlib.util.spec_from_file_location(
    "openai_gateway", ROOT / "deploy" / "gateway" / "openai_gateway.py"
)
gw = importlib.util.module_from_spec(_spec)
sys.modules["openai_gateway"] = gw  # dataclasses look their module up there
_spec.loader.exec_module(gw)

KEY = "sk-test-key-0123456789"
ROUTE = gw.Route("m", "m", 4, True, False)


def _scope(path: str = "/v1/embeddings", key: str = KEY, method: str = "POST") -> dict:
    headers = [(b"authorization", f"Bearer {key}".encode()), (b"content-type", b"application/json")]
    return {"type": "http", "path": path, "method": method, "headers": headers}


async def _call(app, scope: dict, receive) -> tuple[int, dict, dict]:
    sent = []

    async def send(message):
        sent.append(message)

    await app(scope, receive, send)
    headers = {k.decode(): v.decode() for k, v in sent[0]["headers"]}
    return sent[0]["status"], headers, json.loads(sent[1]["body"])


def _body(data: bytes):
    async def receive():
        return {"type": "http.request", "body": data, "more_body": False}
    return receive


def test_past_the_bound_a_request_is_refused_at_once_not_queued(monkeypatch) -> None:
    """With one request in progress (its body still arriving) and a bound of 1, the next
    is answered 503 with Retry-After in OpenAI's shape, before it is read."""
    monkeypatch.setattr(gw, "MAX_IN_FLIGHT", 1)
    app = gw.Gateway({"m": ROUTE}, "http://127.0.0.1:9", KEY)

    async def run():
        release = asyncio.Event()

        async def slow_receive():
            await release.wait()
            return {"type": "http.request", "body": b"{not json", "more_body": False}

        first = asyncio.create_task(_call(app, _scope(), slow_receive))
        await asyncio.sleep(0)
        assert app.in_flight == 1
        refused = await _call(app, _scope(), _body(b'{"model": "m", "input": "x"}'))
        release.set()
        answered = await first
        assert app._session is None  # neither reached Triton
        return refused, answered

    (status, headers, body), (first_status, _, _) = asyncio.run(run())
    assert status == 503 and headers["retry-after"] == "1"
    assert body["error"]["code"] == "overloaded" and "in progress" in body["error"]["message"]
    assert first_status == 400  # the held request still got its own answer
    assert app.in_flight == 0


def test_a_wrong_key_is_refused_before_the_body_is_read() -> None:
    app = gw.Gateway({"m": ROUTE}, "http://127.0.0.1:9", KEY)

    async def never():
        raise AssertionError("the body of an unauthorised request was read")

    status, _, body = asyncio.run(_call(app, _scope(key="sk-wrong-key-000000"), never))
    assert status == 401 and body["error"]["type"] == "authentication_error"


@pytest.mark.parametrize(
    ("header", "seconds"),
    [(b"2.5", 2.5), (b"600", gw.TIMEOUT_S), (b"0", gw.TIMEOUT_S), (b"-1", gw.TIMEOUT_S),
     (b"inf", gw.TIMEOUT_S), (b"soon", gw.TIMEOUT_S), (None, gw.TIMEOUT_S)],
)
def test_the_clients_read_timeout_bounds_the_deadline(header, seconds) -> None:
    headers = {} if header is None else {b"x-stainless-read-timeout": header}
    assert gw.timeout_of(headers) == seconds


def test_tritons_refusals_become_openai_errors() -> None:
    busy = gw.triton_error(503, b'{"error": "server overloaded"}', None)
    assert (busy.status, busy.retry_after, busy.code) == (503, "1", "overloaded")
    assert "server overloaded" in busy.message
    assert gw.triton_error(429, b"{}", "7").retry_after == "7"
    assert gw.triton_error(400, b'{"error": "bad"}', None).status == 400
    assert gw.triton_error(500, b"oops", None).status == 502


def test_unreachable_triton_is_a_502_and_the_server_keeps_serving() -> None:
    app = gw.Gateway({"m": ROUTE}, "http://127.0.0.1:9", KEY)
    body = b'{"model": "m", "input": ["a", "b", "c", "d", "e"]}'

    async def twice():
        answers = [await _call(app, _scope(), _body(body)) for _ in range(2)]
        await app._session.close()
        return answers

    for status, _, answer in asyncio.run(twice()):
        assert status == 502 and "unreachable" in answer["error"]["message"]


def test_an_answer_triton_should_not_give_is_a_502_not_a_dead_worker(monkeypatch) -> None:
    """A 200 whose body is not the ensemble's answer (garbage, no EMBEDDING), from a real
    local HTTP server, is that request's 502; a fault in the app itself is that request's
    500 in OpenAI's shape; the app answers the next request either way."""
    payloads = [b"not json", b'{"outputs": []}', b'{"outputs": [{"name": "X"}]}']
    encodings = []

    class Triton(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            encodings.append(self.headers.get("Accept-Encoding"))
            payload = payloads[0]
            self.send_response(200)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Triton)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    app = gw.Gateway({"m": ROUTE}, f"http://127.0.0.1:{server.server_port}", KEY)
    body = b'{"model": "m", "input": "x"}'

    async def each():
        answers = []
        while payloads:
            answers.append(await _call(app, _scope(), _body(body)))
            payloads.pop(0)
        await app._session.close()
        return answers

    try:
        for status, _, answer in asyncio.run(each()):
            assert status == 502 and "EMBEDDING" in answer["error"]["message"], answer
    finally:
        server.shutdown()
    # Uncompressed: on one host, Triton's gzip costs it ~10 % CPU and the gateway the inflate.
    assert encodings == ["identity"] * 3

    async def broken(request, timeout_s):
        raise RuntimeError("a bug")

    monkeypatch.setattr(app, "embeddings", broken)
    status, _, answer = asyncio.run(_call(app, _scope(), _body(body)))
    assert status == 500 and answer["error"]["type"] == "server_error"
    assert "RuntimeError" in answer["error"]["message"]
