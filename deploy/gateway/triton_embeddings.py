"""LiteLLM proxy provider: OpenAI ``/v1/embeddings`` onto a served Triton text ensemble.

Loaded by the gateway (LiteLLM's proxy, ``custom_provider_map`` in the config that
``python -m generator gateway-config`` writes); it runs in the gateway's own venv / image,
never inside Triton. LiteLLM's built-in ``triton/`` provider sends one request of
``input_text`` [N] and supports no OpenAI parameter (``dimensions`` and
``encoding_format`` are refused or dropped, usage is its own tiktoken count), so this
provider calls the route's ensemble instead (``<name>_openai`` where the entry builds it,
else ``<name>``; never a step), as any Triton client does:

- ``TEXT`` [n, 1] in requests of at most the model's ``max_batch_size`` rows, sent
  concurrently, rows answered in input order; the model's default prompt applies
  (the ensemble applies it to a request without ``prompt_name``);
- ``dimensions`` -> the request parameter ``dimensions`` (Matryoshka: the first k values,
  normalised again) where the model takes it; refused (400) where it does not, and an
  answer of another width is an error, never a vector;
- ``usage.prompt_tokens`` = the sum of the model's ``TOKEN_COUNT`` where the route's
  ensemble answers it (``model_info.token_count``: ``<name>_openai`` of a
  ``litellm = true`` entry, or a plain ensemble with ``token_count = true``); 0 elsewhere;
- ``encoding_format: "base64"``: the float32 rows, little-endian, base64 (OpenAI's form).

Per-model settings come from the deployment's ``model_info`` (written by the generator).

LiteLLM 1.100.0 refuses every OpenAI parameter of an embedding call to a custom provider
(``UnsupportedParamsError``; ``drop_params`` would drop them silently instead). So the
proxy hook :data:`openai_params` (``litellm_settings.callbacks``) renames ``dimensions``
and ``encoding_format`` before routing to ``triton_dimensions`` / ``triton_encoding_format``,
which LiteLLM passes to a custom provider unchanged, and this provider reads those.

Without a database, LiteLLM 1.100.0's own key check answers a missing key with a 500
(it imports ``prisma``, which the proxy extra does not install) and a wrong key with a 400
("No connected db."); :func:`user_api_key_auth` (``general_settings.custom_auth``) checks
the one key, ``LITELLM_MASTER_KEY``, in constant time and refuses with OpenAI's 401.
"""

from __future__ import annotations

import asyncio
import base64
import hmac
import json
import os
import time
from typing import Any

import httpx
import numpy as np
from litellm.integrations.custom_logger import CustomLogger
from litellm.llms.custom_llm import CustomLLM, CustomLLMError
from litellm.proxy._types import ProxyException, UserAPIKeyAuth
from litellm.types.utils import EmbeddingResponse, Usage

# OpenAI's own bound on the inputs of one request.
MAX_INPUTS = 2048
TIMEOUT_S = 60.0
# OpenAI parameter -> the name it travels under from the proxy hook to the provider.
CARRIED = {"dimensions": "triton_dimensions", "encoding_format": "triton_encoding_format"}


def _texts(value: Any) -> list[str]:
    """``input`` as OpenAI takes it (a string or a list of strings), checked."""
    texts = [value] if isinstance(value, str) else value
    if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
        raise CustomLLMError(400, "input must be a string or a list of strings")
    if not texts:
        raise CustomLLMError(400, "input must not be empty")
    if len(texts) > MAX_INPUTS:
        raise CustomLLMError(400, f"input has {len(texts)} items, more than {MAX_INPUTS}")
    empty = [i for i, t in enumerate(texts) if not t]
    if empty:
        raise CustomLLMError(400, f"input[{empty[0]}] is an empty string")
    images = [i for i, t in enumerate(texts) if t[:11].lower() == "data:image/"]
    if images:
        raise CustomLLMError(
            400, f"input[{images[0]}] is an image data URI: the gateway embeds text only"
        )
    return texts


def _dimensions(value: Any, info: dict) -> int | None:
    """``dimensions`` checked against what the model allows (None: the model's default)."""
    if value is None:
        return None
    if not info.get("dimensions"):
        raise CustomLLMError(400, f"model {info['name']} does not take dimensions")
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise CustomLLMError(400, f"dimensions must be a positive integer, got {value!r}")
    return value


def _encoding(value: Any) -> str:
    if value in (None, "float", "base64"):
        return value or "float"
    raise CustomLLMError(400, f"encoding_format must be 'float' or 'base64', got {value!r}")


def _deadline_us(timeout: Any) -> int:
    """The request's deadline for Triton, µs since the epoch.

    The call's ``timeout`` (seconds, as LiteLLM passes it on), at most the provider's own
    wait for Triton.
    """
    seconds = TIMEOUT_S
    if isinstance(timeout, (int, float)) and not isinstance(timeout, bool) and timeout > 0:
        seconds = min(seconds, float(timeout))
    return int((time.time() + seconds) * 1e6)


def _body(texts: list[str], dimensions: int | None, token_count: bool, deadline: int) -> dict:
    outputs = [{"name": "EMBEDDING"}, *([{"name": "TOKEN_COUNT"}] if token_count else [])]
    # The deadline steers the server's admission: refused at once when it cannot be met.
    parameters: dict[str, Any] = {"deadline_unix_us": deadline}
    if dimensions is not None:
        parameters["dimensions"] = dimensions
    return {
        "inputs": [
            {"name": "TEXT", "shape": [len(texts), 1], "datatype": "BYTES", "data": texts}
        ],
        "outputs": outputs,
        "parameters": parameters,
    }


def _triton_error(response: httpx.Response) -> CustomLLMError:
    try:
        message = json.loads(response.text).get("error") or response.text
    except (ValueError, AttributeError):
        message = response.text
    status = response.status_code if response.status_code in (400, 429, 503) else 502
    return CustomLLMError(status, f"Triton: {message}")


def _rows(answer: dict, n: int) -> tuple[np.ndarray, int]:
    """(EMBEDDING [n, D] float32, the sum of TOKEN_COUNT or 0) of one Triton answer."""
    outputs = {o["name"]: o for o in answer.get("outputs", [])}
    embedding = np.asarray(outputs["EMBEDDING"]["data"], dtype=np.float32).reshape(n, -1)
    counts = outputs.get("TOKEN_COUNT")
    return embedding, int(sum(counts["data"])) if counts else 0


class TritonEmbeddings(CustomLLM):
    """The provider ``triton-embeddings``: ``model`` is the Triton ensemble's name."""

    def __init__(self) -> None:
        super().__init__()
        self._clients: dict[int, httpx.AsyncClient] = {}

    def _client(self) -> httpx.AsyncClient:
        """One pooled client per event loop (the proxy runs one loop per worker)."""
        loop = id(asyncio.get_running_loop())
        if loop not in self._clients:
            limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
            self._clients[loop] = httpx.AsyncClient(timeout=TIMEOUT_S, limits=limits)
        return self._clients[loop]

    async def _infer(self, url: str, body: dict) -> dict:
        try:
            response = await self._client().post(url, json=body)
        except httpx.HTTPError as error:
            raise CustomLLMError(502, f"Triton unreachable: {type(error).__name__}") from None
        if response.status_code != 200:
            raise _triton_error(response)
        return response.json()

    async def aembedding(
        self,
        model: str,
        input: list,
        model_response: EmbeddingResponse,
        print_verbose: Any,
        logging_obj: Any,
        optional_params: dict,
        api_key: str | None = None,
        api_base: str | None = None,
        timeout: Any = None,
        litellm_params: dict | None = None,
    ) -> EmbeddingResponse:
        """Embed ``input`` with the ensemble ``model`` at ``api_base`` (Triton's HTTP URL)."""
        info = {"name": model, **((litellm_params or {}).get("model_info") or {})}
        if optional_params.get("modality") not in (None, "text"):
            raise CustomLLMError(400, "modality: the gateway embeds text only")
        texts = _texts(input)
        dimensions = _dimensions(optional_params.get(CARRIED["dimensions"]), info)
        encoding = _encoding(optional_params.get(CARRIED["encoding_format"]))
        size = int(info.get("max_batch_size") or 1)
        url = f"{(api_base or '').rstrip('/')}/v2/models/{model}/infer"
        counting = bool(info.get("token_count"))
        chunks = [texts[i : i + size] for i in range(0, len(texts), size)]
        deadline = _deadline_us(timeout)
        answers = await asyncio.gather(
            *(self._infer(url, _body(chunk, dimensions, counting, deadline)) for chunk in chunks)
        )
        parts = [_rows(answer, len(chunk)) for answer, chunk in zip(answers, chunks, strict=True)]
        rows = np.concatenate([p[0] for p in parts])
        if dimensions is not None and rows.shape[1] != dimensions:
            raise CustomLLMError(
                500, f"Triton answered width {rows.shape[1]} for dimensions {dimensions}"
            )
        tokens = sum(p[1] for p in parts)
        model_response.object = "list"
        model_response.model = info.get("public_name", model)
        model_response.data = [
            {"object": "embedding", "index": i, "embedding": _encoded(row, encoding)}
            for i, row in enumerate(rows)
        ]
        model_response.usage = Usage(prompt_tokens=tokens, completion_tokens=0, total_tokens=tokens)
        return model_response

    def embedding(self, *args: Any, **kwargs: Any) -> EmbeddingResponse:
        """The sync form (the proxy calls ``aembedding``; LiteLLM's SDK may call this)."""
        return asyncio.run(self.aembedding(*args, **kwargs))


def _encoded(row: np.ndarray, encoding: str) -> list[float] | str:
    if encoding == "base64":
        return base64.b64encode(row.astype("<f4").tobytes()).decode("ascii")
    return row.tolist()


class CarryOpenAIParams(CustomLogger):
    """Proxy hook: an embedding request's OpenAI parameters, renamed for the provider."""

    async def async_pre_call_hook(
        self, user_api_key_dict: Any, cache: Any, data: dict, call_type: Any
    ) -> dict:
        """Refuse an unknown model with OpenAI's 404; rename :data:`CARRIED` keys.

        Other calls pass unchanged. LiteLLM's router would answer an unknown model 400.
        """
        if call_type not in ("embeddings", "aembedding"):
            return data
        from litellm.proxy.proxy_server import llm_router  # noqa: PLC0415 - set at start

        names = llm_router.model_names if llm_router is not None else []
        if data.get("model") not in names:
            raise ProxyException(
                message=f"The model '{data.get('model')}' does not exist",
                type="invalid_request_error",
                param="model",
                code=404,
                openai_code="model_not_found",
            )
        for name, carried in CARRIED.items():
            if name in data:
                data[carried] = data.pop(name)
        # OpenAI's end-user id (abuse monitoring): no effect on the vector, and LiteLLM
        # would refuse it for a custom provider.
        data.pop("user", None)
        return data


async def user_api_key_auth(request: Any, api_key: str | None) -> UserAPIKeyAuth:
    """The proxy's key check: ``Authorization: Bearer <LITELLM_MASTER_KEY>``, else 401."""
    expected = os.environ.get("LITELLM_MASTER_KEY", "")
    given = (api_key or "").removeprefix("Bearer ").strip()
    if expected and given and hmac.compare_digest(given.encode(), expected.encode()):
        return UserAPIKeyAuth(api_key=given)
    raise ProxyException(
        message="invalid or missing API key: send 'Authorization: Bearer <key>'",
        type="authentication_error",
        param=None,
        code=401,
        openai_code="invalid_api_key",
    )


handler = TritonEmbeddings()
openai_params = CarryOpenAIParams()
