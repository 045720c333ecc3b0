"""OpenAI ``/v1/embeddings`` onto the served Triton text ensembles: an ASGI app for uvicorn.

Started by ``deploy/gateway/run_gateway.sh`` (uvicorn, uvloop, ``GATEWAY_WORKERS``
processes); it runs in the gateway's own venv / image, never inside Triton. The config is
the YAML ``python -m generator gateway-config`` writes from the manifest (``models``: the
public name, the ensemble called, rows per Triton request, whether ``dimensions`` is taken
and ``TOKEN_COUNT`` answered). Why not LiteLLM's proxy, which this replaced: it spent
6-8 ms of CPU per one-sentence request in its own router, callbacks and middleware,
whatever its settings (docs/benchmarks.md, "The OpenAI gateway").

What a request gets (docs/clients.md, "OpenAI /v1/embeddings"):

- ``TEXT`` [n, 1] to the ensemble in requests of at most ``max_batch_size`` rows, sent
  concurrently over pooled keep-alive connections, rows answered in input order;
- ``dimensions`` -> Triton's ``dimensions`` parameter where the model takes it, else 400;
  an answer of another width is an error, never a vector;
- ``usage.prompt_tokens``: the sum of ``TOKEN_COUNT`` where the ensemble answers it, else 0;
- ``encoding_format: "base64"``: the float32 rows, little-endian, base64;
- a deadline: the client's read timeout (``X-Stainless-Read-Timeout``, which the OpenAI SDK
  sends) or :data:`TIMEOUT_S`, whichever is sooner, passed to Triton as
  ``deadline_unix_us``, so Triton refuses at once work it cannot finish in time;
- Triton's refusals as OpenAI errors: 400 kept, 429 / 503 kept with ``Retry-After``,
  anything else 502.

Closed by default: every route but ``/health/*`` needs ``Authorization: Bearer <key>``
(``LITELLM_MASTER_KEY``, compared in constant time); bodies over :data:`MAX_BODY` are
refused unread (413); unknown parameters are refused by name; past
``GATEWAY_MAX_IN_FLIGHT`` requests in progress in a worker, a request is refused at once
with 503 and ``Retry-After`` rather than queued.
"""

from __future__ import annotations

import asyncio
import base64
import hmac
import logging
import os
import sys
import time
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import yaml

# OpenAI's own bound on the inputs of one request.
MAX_INPUTS = 2048
# A request body larger than this is refused before it is read (OpenAI's inputs are bounded
# by 2,048 texts of at most 8,192 tokens; 16 MiB holds those with room).
MAX_BODY = 16 << 20
# The longest a request waits for Triton when its client states no shorter timeout.
TIMEOUT_S = 60.0
# Requests in progress per worker past which new ones are refused (503, Retry-After).
MAX_IN_FLIGHT = int(os.environ.get("GATEWAY_MAX_IN_FLIGHT", "512"))
RETRY_AFTER_S = "1"
# How much longer than a request's own timeout the gateway waits for Triton's answer.
WAIT_MARGIN_S = 5.0
KNOWN_FIELDS = frozenset({"model", "input", "encoding_format", "dimensions", "user", "modality"})
JSON = [(b"content-type", b"application/json")]
LOG = logging.getLogger("openai_gateway")


class OpenAIError(Exception):
    """An answer in OpenAI's error shape: ``{"error": {message, type, param, code}}``."""

    TYPES = {400: "invalid_request_error", 401: "authentication_error", 404:
             "invalid_request_error", 405: "invalid_request_error", 413:
             "invalid_request_error", 429: "rate_limit_error"}

    def __init__(self, status: int, message: str, code: str | None = None,
                 param: str | None = None, retry_after: str | None = None):
        super().__init__(message)
        self.status, self.message, self.code, self.param = status, message, code, param
        self.retry_after = retry_after

    def body(self) -> bytes:
        """The JSON answer."""
        kind = self.TYPES.get(self.status, "server_error")
        error = {"message": self.message, "type": kind, "param": self.param, "code": self.code}
        return orjson.dumps({"error": error})


@dataclass(frozen=True)
class Route:
    """One public model name and the Triton ensemble that answers it."""

    name: str
    ensemble: str
    max_batch_size: int
    dimensions: bool
    token_count: bool


def load_routes(path: Path) -> dict[str, Route]:
    """The config's ``models`` by public name."""
    config = yaml.safe_load(path.read_text()) or {}
    return {m["name"]: Route(**m) for m in config.get("models") or []}


def texts_of(value: Any) -> list[str]:
    """``input`` as OpenAI takes it (a string or a list of strings), checked."""
    texts = [value] if isinstance(value, str) else value
    if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
        raise OpenAIError(400, "input must be a string or a list of strings (token arrays "
                          "are not taken: send the text)", param="input")
    if not texts:
        raise OpenAIError(400, "input must not be empty", param="input")
    if len(texts) > MAX_INPUTS:
        raise OpenAIError(400, f"input has {len(texts)} items, more than {MAX_INPUTS}",
                          param="input")
    for i, text in enumerate(texts):
        if not text:
            raise OpenAIError(400, f"input[{i}] is an empty string", param="input")
        if text[:11].lower() == "data:image/":
            raise OpenAIError(400, f"input[{i}] is an image data URI: the gateway embeds "
                              "text only", param="input")
    return texts


def dimensions_of(value: Any, route: Route) -> int | None:
    """``dimensions`` checked against what the model allows (None: the model's width)."""
    if value is None:
        return None
    if not route.dimensions:
        raise OpenAIError(400, f"model {route.name} does not take dimensions", param="dimensions")
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise OpenAIError(400, f"dimensions must be a positive integer, got {value!r}",
                          param="dimensions")
    return value


def encoding_of(value: Any) -> str:
    """``encoding_format`` checked: ``float`` (the default) or ``base64``."""
    if value in (None, "float", "base64"):
        return value or "float"
    raise OpenAIError(400, f"encoding_format must be 'float' or 'base64', got {value!r}",
                      param="encoding_format")


def timeout_of(headers: dict[bytes, bytes]) -> float:
    """Seconds the client waits: its ``X-Stainless-Read-Timeout``, at most :data:`TIMEOUT_S`."""
    try:
        stated = float(headers.get(b"x-stainless-read-timeout", b""))
    except ValueError:
        return TIMEOUT_S
    return min(stated, TIMEOUT_S) if 0 < stated < float("inf") else TIMEOUT_S


def triton_body(texts: list[str], dimensions: int | None, token_count: bool,
                deadline_us: int) -> bytes:
    """The Triton JSON request of one part of ``input``."""
    outputs = [{"name": "EMBEDDING"}, *([{"name": "TOKEN_COUNT"}] if token_count else [])]
    parameters: dict[str, Any] = {"deadline_unix_us": deadline_us}
    if dimensions is not None:
        parameters["dimensions"] = dimensions
    tensor = {"name": "TEXT", "shape": [len(texts), 1], "datatype": "BYTES", "data": texts}
    return orjson.dumps({"inputs": [tensor], "outputs": outputs, "parameters": parameters})


def triton_rows(answer: bytes, n: int) -> tuple[list[list[float]], int]:
    """(the ``n`` EMBEDDING rows, the sum of TOKEN_COUNT or 0) of one Triton answer."""
    outputs = {o["name"]: o for o in orjson.loads(answer)["outputs"]}
    flat = outputs["EMBEDDING"]["data"]
    width = len(flat) // n
    counts = outputs.get("TOKEN_COUNT")
    return [flat[i * width:(i + 1) * width] for i in range(n)], sum(counts["data"]) if counts else 0


def triton_error(status: int, answer: bytes, retry_after: str | None) -> OpenAIError:
    """Triton's refusal as an OpenAI error: 400 kept, 429 / 503 kept with Retry-After."""
    try:
        message = orjson.loads(answer).get("error") or answer.decode(errors="replace")
    except (orjson.JSONDecodeError, AttributeError):
        message = answer[:500].decode(errors="replace")
    if status in (429, 503):
        return OpenAIError(status, f"Triton: {message}", code="overloaded",
                           retry_after=retry_after or RETRY_AFTER_S)
    return OpenAIError(status if status == 400 else 502, f"Triton: {message}")


def base64_row(row: list[float]) -> str:
    """A row as OpenAI's base64: float32, little-endian."""
    packed = array("f", row)
    if sys.byteorder == "big":
        packed.byteswap()
    return base64.b64encode(packed.tobytes()).decode("ascii")


class Gateway:
    """The ASGI app: routes of the config, Triton at ``triton_url``, the one ``key``."""

    def __init__(self, routes: dict[str, Route], triton_url: str, key: str):
        self.routes, self.key = routes, key.encode()
        self.triton_url = triton_url.rstrip("/")
        self.in_flight = 0
        self._session: aiohttp.ClientSession | None = None

    def session(self) -> aiohttp.ClientSession:
        """One pooled session per worker, made in its running loop."""
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=64, keepalive_timeout=30)
            # Identity: a compressed answer costs Triton and the gateway CPU on one host.
            headers = {"Content-Type": "application/json", "Accept-Encoding": "identity"}
            self._session = aiohttp.ClientSession(
                connector=connector, headers=headers, auto_decompress=False
            )
        return self._session

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        """ASGI: lifespan and HTTP; every answer JSON, errors in OpenAI's shape."""
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        headers = dict(scope["headers"])
        try:
            status, body, extra = await self._answer(scope, headers, receive)
        except OpenAIError as error:
            status, body = error.status, error.body()
            extra = [(b"retry-after", error.retry_after.encode())] if error.retry_after else []
        except Exception as error:
            LOG.exception("request failed")
            failed = OpenAIError(500, f"the gateway failed: {type(error).__name__}")
            status, body, extra = failed.status, failed.body(), []
        length = [(b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": status,
                    "headers": JSON + length + extra})
        await send({"type": "http.response.body", "body": body})

    async def _lifespan(self, receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self._session is not None:
                    await self._session.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _answer(self, scope: dict, headers: dict, receive: Any) -> tuple[int, bytes, list]:
        path, method = scope["path"].rstrip("/"), scope["method"]
        if path in ("/health/liveliness", "/health/readiness", "/health"):
            return 200, b'{"status":"healthy"}', []
        self._authorise(headers)
        if path in ("/v1/models", "/models") and method == "GET":
            models = [{"id": name, "object": "model", "created": 0, "owned_by": "triton"}
                      for name in self.routes]
            return 200, orjson.dumps({"object": "list", "data": models}), []
        if path not in ("/v1/embeddings", "/embeddings"):
            raise OpenAIError(404, f"no route {scope['path']}: POST /v1/embeddings")
        if method != "POST":
            raise OpenAIError(405, "use POST for /v1/embeddings")
        if self.in_flight >= MAX_IN_FLIGHT:
            raise OpenAIError(503, f"the gateway has {self.in_flight} requests in progress; "
                              "try again later", code="overloaded", retry_after=RETRY_AFTER_S)
        self.in_flight += 1
        try:
            request = await self._body(headers, receive)
            return 200, await self.embeddings(request, timeout_of(headers)), []
        finally:
            self.in_flight -= 1

    def _authorise(self, headers: dict[bytes, bytes]) -> None:
        given = headers.get(b"authorization", b"").removeprefix(b"Bearer ").strip()
        if not (given and hmac.compare_digest(given, self.key)):
            raise OpenAIError(401, "invalid or missing API key: send 'Authorization: Bearer "
                              "<key>'", code="invalid_api_key")

    async def _body(self, headers: dict[bytes, bytes], receive: Any) -> dict:
        try:
            declared = int(headers.get(b"content-length", b"0"))
        except ValueError:
            raise OpenAIError(400, "bad Content-Length") from None
        if declared > MAX_BODY:
            raise OpenAIError(413, f"request body over {MAX_BODY} bytes")
        chunks, size = [], 0
        while True:
            message = await receive()
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > MAX_BODY:
                raise OpenAIError(413, f"request body over {MAX_BODY} bytes")
            chunks.append(chunk)
            if not message.get("more_body"):
                break
        try:
            request = orjson.loads(b"".join(chunks))
        except orjson.JSONDecodeError:
            raise OpenAIError(400, "the body is not JSON") from None
        if not isinstance(request, dict):
            raise OpenAIError(400, "the body must be a JSON object")
        unknown = sorted(set(request) - KNOWN_FIELDS)
        if unknown:
            raise OpenAIError(400, f"unsupported parameter: {unknown[0]}", param=unknown[0])
        return request

    async def embeddings(self, request: dict, timeout_s: float) -> bytes:
        """The answer body of one ``/v1/embeddings`` request."""
        name = request.get("model")
        route = self.routes.get(name) if isinstance(name, str) else None
        if route is None:
            raise OpenAIError(404, f"The model '{name}' does not exist", code="model_not_found",
                              param="model")
        if request.get("modality") not in (None, "text"):
            raise OpenAIError(400, "modality: the gateway embeds text only", param="modality")
        texts = texts_of(request.get("input"))
        dimensions = dimensions_of(request.get("dimensions"), route)
        encoding = encoding_of(request.get("encoding_format"))
        deadline_us = int((time.time() + timeout_s) * 1e6)
        size = route.max_batch_size
        parts = [texts[i:i + size] for i in range(0, len(texts), size)]
        url = f"{self.triton_url}/v2/models/{route.ensemble}/infer"
        answers = await asyncio.gather(*(
            self._infer(url, triton_body(part, dimensions, route.token_count, deadline_us),
                        len(part), timeout_s)
            for part in parts
        ))
        rows = [row for part_rows, _ in answers for row in part_rows]
        tokens = sum(count for _, count in answers)
        if dimensions is not None and len(rows[0]) != dimensions:
            raise OpenAIError(500, f"Triton answered width {len(rows[0])} for dimensions "
                              f"{dimensions}")
        encode = base64_row if encoding == "base64" else None
        data = [{"object": "embedding", "index": i, "embedding": encode(row) if encode else row}
                for i, row in enumerate(rows)]
        usage = {"prompt_tokens": tokens, "total_tokens": tokens}
        return orjson.dumps({"object": "list", "data": data, "model": route.name, "usage": usage})

    async def _infer(self, url: str, body: bytes, n: int, timeout_s: float):
        # Triton knows the deadline and refuses past it; the gateway waits a little longer,
        # so that refusal is what the client reads, and gives up only on a silent Triton.
        wait = aiohttp.ClientTimeout(total=timeout_s + WAIT_MARGIN_S)
        try:
            async with self.session().post(url, data=body, timeout=wait) as response:
                answer = await response.read()
                if response.status != 200:
                    retry_after = response.headers.get("Retry-After")
                    raise triton_error(response.status, answer, retry_after)
        except TimeoutError:
            raise OpenAIError(504, f"Triton did not answer in {timeout_s:g} s") from None
        except aiohttp.ClientError as error:
            raise OpenAIError(502, f"Triton unreachable: {type(error).__name__}") from None
        try:
            return triton_rows(answer, n)
        except (orjson.JSONDecodeError, KeyError, TypeError, ZeroDivisionError):
            raise OpenAIError(502, "Triton's answer is not the ensemble's EMBEDDING") from None


def app() -> Gateway:
    """The app uvicorn serves (``--factory``).

    Its config at ``GATEWAY_CONFIG``, Triton at ``TRITON_HTTP_URL``, the key in
    ``LITELLM_MASTER_KEY``.
    """
    return Gateway(
        load_routes(Path(os.environ["GATEWAY_CONFIG"])),
        os.environ.get("TRITON_HTTP_URL", "http://127.0.0.1:8000"),
        os.environ["LITELLM_MASTER_KEY"],
    )
