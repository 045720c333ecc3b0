"""Triton Python model ``fetch_image``: download the ``IMAGE_URL`` rows of a batch.

All URLs of one ``execute`` are fetched concurrently on a thread pool built once.
Each URL is checked against the SSRF policy (schemes, resolved addresses on every
redirect, byte cap, timeouts); a failed URL fails only its own request.
"""

import traceback
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import triton_python_backend_utils as pb_utils
from embed_runtime.adapter import config_parameters, error_response, input_array
from embed_runtime.errors import RequestError
from embed_runtime.fetch import FetchPolicy, fetch_all
from embed_runtime.text import decode_texts


class TritonPythonModel:
    """Turns ``IMAGE_URL`` rows into encoded image bytes (``IMAGE``)."""

    def initialize(self, args):
        """Read the fetch policy and start the thread pool."""
        self.logger = pb_utils.Logger
        params = config_parameters(args["model_config"])
        self.policy = FetchPolicy.from_parameters(params)
        workers = int(params["max_concurrency"])
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="fetch")

    def execute(self, requests):
        """Fetch every URL of every valid request at once; errors stay per request."""
        responses = [None] * len(requests)
        valid, counts, urls = [], [], []
        for i, request in enumerate(requests):
            try:
                rows = decode_texts(input_array(pb_utils, request, "IMAGE_URL"), "IMAGE_URL")
            except RequestError as exc:
                responses[i] = error_response(pb_utils, exc)
                continue
            valid.append(i)
            counts.append(len(rows))
            urls.extend(rows)
        try:
            results = fetch_all(urls, self.policy, self.pool) if urls else []
        except Exception as exc:  # noqa: BLE001 - every request must get a response
            self.logger.log_error(traceback.format_exc())
            for i in valid:
                responses[i] = error_response(pb_utils, exc, self.logger.log_error)
            return responses
        start = 0
        for i, count in zip(valid, counts, strict=True):
            mine = results[start : start + count]
            start += count
            failed = next((r for r in mine if isinstance(r, RequestError)), None)
            if failed is not None:
                responses[i] = error_response(pb_utils, failed)
                continue
            images = np.empty((count, 1), dtype=np.object_)
            images[:, 0] = mine
            responses[i] = pb_utils.InferenceResponse([pb_utils.Tensor("IMAGE", images)])
        return responses

    def finalize(self):
        """Stop the thread pool."""
        self.pool.shutdown(wait=False, cancel_futures=True)
