"""Triton Python model ``fetch_image``: download the ``IMAGE_URL`` rows of a batch.

All URLs of one ``execute`` are fetched concurrently on a pool built once, and each
request is answered through its response sender as soon as its own URLs are done, so a
slow URL never holds back the other requests of the batch; ``execute`` returns ``None``.
(Measured on the Triton 2.51 shipped here: a non-decoupled model may send its one final
response per request from any thread, during or after ``execute``, ensembles included.)
``execute`` blocks while ``max_concurrency`` URLs are in flight. Each URL is checked
against the SSRF policy; a failed URL fails only its own request.
"""

import threading
import traceback

import numpy as np
import triton_python_backend_utils as pb_utils
from embed_runtime.adapter import config_parameters, error_response, gather_rows, input_array
from embed_runtime.errors import RequestError
from embed_runtime.fetch import FetchPolicy
from embed_runtime.fetch_pool import FetchPool
from embed_runtime.tokenizer import decode_texts


class _Reply:
    """Sends the one final response of one request; later sends are dropped."""

    def __init__(self, request):
        self._sender = request.get_response_sender()
        self._lock = threading.Lock()
        self._sent = False

    def send(self, response) -> None:
        with self._lock:
            if self._sent:
                return
            self._sent = True
        try:
            self._sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        except Exception:  # noqa: BLE001 - runs on a fetch thread; nothing to raise to
            pb_utils.Logger.log_error(traceback.format_exc())


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
        self.logger = pb_utils.Logger
        params = config_parameters(args["model_config"])
        policy = FetchPolicy.from_parameters(params)
        self.pool = FetchPool(policy, int(params["max_concurrency"]))

    def execute(self, requests):
        """Start every URL of every valid request; each request is answered when done."""
        replies = [_Reply(r) for r in requests]
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
            owners = [replies[i] for i in batch.valid]
            self.pool.fetch_groups(groups, lambda g, results: self._answer(owners[g], results))
        except Exception as exc:  # noqa: BLE001 - every request must get a response
            self.logger.log_error(traceback.format_exc())
            for reply in replies:
                reply.send(error_response(pb_utils, exc, self.logger.log_error))
        return None

    def _answer(self, reply: _Reply, results) -> None:
        try:
            response = _response(results)
        except Exception as exc:  # noqa: BLE001 - every request must get a response
            response = error_response(pb_utils, exc, self.logger.log_error)
        reply.send(response)

    def finalize(self):
        """Stop the fetch pool (Triton has waited for the responses in flight)."""
        self.pool.close()
