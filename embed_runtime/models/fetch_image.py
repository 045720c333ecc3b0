"""Triton Python model ``fetch_image``: download the ``IMAGE_URL`` rows of a batch.

All URLs of one ``execute`` are fetched concurrently on a pool built once, and each
request is answered through its response sender as soon as its own URLs are done, so a
slow URL never holds back the other requests of the batch. (Measured on the Triton 2.51
shipped here: a non-decoupled model may send its one final response per request from any
thread during ``execute``, ensembles included.)

``execute`` returns only once every request of its batch is answered. A request still
open when ``execute`` has returned belongs to nobody: if the stub then dies (``kill -9``,
the OOM killer), Triton's Python backend never answers it and the client waits for its
own deadline (60 s, measured). While ``execute`` runs, the backend watches the stub; when
it dies, every request of the batch not answered yet gets an error ("Stub process ... is
not healthy") within seconds, and those already answered are left alone (the backend
records each final response sent). So the cost of a slow URL is the instance it holds:
batches run one at a time per instance, and ``[fetch_image] instances`` sets how many run
side by side. Each URL is checked against the SSRF policy; a failed URL fails only its
own request.
"""

import threading
import time
import traceback

import numpy as np
import triton_python_backend_utils as pb_utils
from embed_runtime.serving.adapter import (
    config_parameters,
    error_response,
    gather_rows,
    input_array,
)
from embed_runtime.errors import RequestError
from embed_runtime.fetch.params import FetchParams
from embed_runtime.fetch.pool import FetchPool
from embed_runtime.ops.server_exit import exit_with_server
from embed_runtime.text.tokenizer import decode_texts


# How long ``execute`` waits for its batch beyond the fetches' own deadlines before it
# gives up holding it (a bug, never a slow URL: each fetch ends by its deadline).
HOLD_MARGIN_S = 30.0


class _Reply:
    """Sends the one final response of one request; later sends are dropped."""

    def __init__(self, request):
        self._sender = request.get_response_sender()
        self._lock = threading.Lock()
        self._sent = False
        self.done = threading.Event()

    def send(self, response) -> None:
        with self._lock:
            if self._sent:
                return
            self._sent = True
        try:
            self._sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        except Exception:  # noqa: BLE001 - runs on a fetch thread; nothing to raise to
            pb_utils.Logger.log_error(traceback.format_exc())
        finally:
            self.done.set()


def _response(results):
    failed = next((r for r in results if isinstance(r, RequestError)), None)
    if failed is not None:
        return error_response(pb_utils, failed)
    images = np.empty((len(results), 1), dtype=np.object_)
    images[:, 0] = results
    return pb_utils.InferenceResponse([pb_utils.Tensor("IMAGE", images)])


class TritonPythonModel:
    """Turns ``IMAGE_URL`` rows into encoded image bytes (``IMAGE``)."""

    def initialize(self, args):
        """Read the fetch policy and start the fetch pool."""
        exit_with_server()
        self.logger = pb_utils.Logger
        fetch = FetchParams.from_parameters(config_parameters(args["model_config"]))
        policy = fetch.policy()
        self.pool = FetchPool(policy, fetch.max_concurrency)
        self.max_concurrency = fetch.max_concurrency
        self.url_deadline_s = policy.connect_timeout_s + policy.read_timeout_s

    def execute(self, requests):
        """Fetch every URL of every valid request; each request is answered when done.

        Returns once all are answered (see the module's docstring for why).
        """
        replies = [_Reply(r) for r in requests]
        urls = len(requests)
        try:
            batch = gather_rows(
                pb_utils,
                requests,
                lambda r: decode_texts(input_array(pb_utils, r, "IMAGE_URL"), "IMAGE_URL"),
            )
            for reply, response in zip(replies, batch.responses, strict=True):
                if response is not None:
                    reply.send(response)
            groups = [batch.items[start:stop] for _, start, stop in batch.slices()]
            urls = sum(len(g) for g in groups)
            owners = [replies[i] for i in batch.valid]
            self.pool.fetch_groups(groups, lambda g, results: self._answer(owners[g], results))
        except Exception as exc:  # noqa: BLE001 - every request must get a response
            self.logger.log_error(traceback.format_exc())
            for reply in replies:
                reply.send(error_response(pb_utils, exc, self.logger.log_error))
        self._hold(replies, urls)
        return None

    def _hold(self, replies: list[_Reply], urls: int) -> None:
        """Wait until every reply is sent: URLs wait for a slot, each ends by its deadline."""
        limit = (1 + urls // self.max_concurrency) * self.url_deadline_s + HOLD_MARGIN_S
        until = time.monotonic() + limit
        for reply in replies:
            if not reply.done.wait(max(0.0, until - time.monotonic())):
                still = sum(not r.done.is_set() for r in replies)
                self.logger.log_error(
                    f"fetch_image: {still} request(s) still open after {limit:g} s; "
                    "execute returns without them"
                )
                return

    def _answer(self, reply: _Reply, results) -> None:
        try:
            response = _response(results)
        except Exception as exc:  # noqa: BLE001 - every request must get a response
            response = error_response(pb_utils, exc, self.logger.log_error)
        reply.send(response)

    def finalize(self):
        """Stop the fetch pool (Triton has waited for the responses in flight)."""
        self.pool.close()
