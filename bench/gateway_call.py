"""The gateway's two halves measured apart, for ``bench.gateway``'s table by part.

    $GATEWAY_PYTHON bench/gateway_call.py CONFIG URL MODEL CLIENTS REQUESTS < texts.json
    $GATEWAY_PYTHON bench/gateway_call.py serve PORT SIZE WAIT_S

``$GATEWAY_PYTHON``: the gateway's own venv's python (``.build/gateway-venv``: uvloop,
httptools, the locked aiohttp and uvicorn).

``serve``: uvicorn with the gateway's settings (``deploy/gateway/run_gateway.sh``) serving
an app that reads the request's body and answers ``SIZE`` bytes of JSON ``WAIT_S`` seconds
later (as long as Triton takes at that load): the HTTP server's
share of a request, measured from outside as that process's CPU.

Otherwise: ``Gateway.embeddings`` of ``deploy/gateway/openai_gateway.py``, with the routes
of the gateway's ``CONFIG`` and Triton at ``URL``, answers an OpenAI request for the texts
on stdin, ``CLIENTS`` at once,
``REQUESTS`` each: the checks, Triton's request, the call (aiohttp), the answer parsed and
the answer's JSON written, as the served gateway does them. Prints
``{"us_per_request": ...}``: this process's CPU per request, warm-up left out.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
import time
from pathlib import Path

WARMUP = 5
# The two rows of bench.gateway's table by part measured under load, as its run files name them.
CALL_PART = "the call to Triton: aiohttp and the event loop"
SERVER_PART = "the HTTP server: uvicorn"


def gateway_module():
    """``deploy/gateway/openai_gateway.py``, imported by path (it is no package's module)."""
    path = Path(__file__).resolve().parents[1] / "deploy" / "gateway" / "openai_gateway.py"
    spec = importlib.util.spec_from_file_location("openai_gateway", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


async def _measure(config: Path, url: str, request: dict, clients: int, requests: int) -> float:
    gw = gateway_module()
    gateway = gw.Gateway(gw.load_routes(config), url, "unused")

    async def client(count: int) -> None:
        for _ in range(count):
            await gateway.embeddings(request, gw.TIMEOUT_S)

    try:
        await asyncio.gather(*(client(WARMUP) for _ in range(clients)))
        start = time.process_time()
        await asyncio.gather(*(client(requests) for _ in range(clients)))
        return (time.process_time() - start) / (clients * requests)
    finally:
        await gateway.session().close()


def serve(port: int, size: int, wait_s: float) -> None:
    """Serve, as the gateway's uvicorn does, an app that answers ``size`` bytes after ``wait_s``."""
    import uvicorn

    answer = b'{"data":"' + b"0" * max(0, size - 11) + b'"}'
    headers = [(b"content-type", b"application/json"),
               (b"content-length", str(len(answer)).encode())]

    async def app(scope: dict, receive, send) -> None:
        more = True
        while more:
            more = (await receive()).get("more_body", False)
        if wait_s:
            await asyncio.sleep(wait_s)
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": answer})

    uvicorn.run(app, host="127.0.0.1", port=port, loop="uvloop", http="httptools",
                lifespan="off", access_log=False, server_header=False, date_header=False,
                log_level="warning", backlog=2048, timeout_keep_alive=30)


def main() -> None:
    """``serve``, or measure ``Gateway.embeddings``."""
    if sys.argv[1] == "serve":
        serve(int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]))
        return
    config, url, model = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    clients, requests = int(sys.argv[4]), int(sys.argv[5])
    import uvloop  # the gateway venv's; bench.gateway imports this module without it

    request = {"model": model, "input": json.loads(sys.stdin.read()), "encoding_format": "float"}
    seconds = uvloop.run(_measure(config, url, request, clients, requests))
    print(json.dumps({"us_per_request": 1e6 * seconds}))


if __name__ == "__main__":
    main()
