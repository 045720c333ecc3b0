"""Triton Python model ``fetch_image``: download the ``IMAGE_URL`` rows of a batch.

All URLs of one ``execute`` are fetched concurrently on a thread pool built once.
Each URL is checked against the SSRF policy (schemes, resolved addresses on every
redirect, byte cap, timeouts); a failed URL fails only its own request.
"""

import traceback
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import triton_python_backend_utils as pb_utils
from embed_runtime.adapter import config_parameters, error_response, gather_rows, input_array
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
        batch = gather_rows(
            pb_utils,
            requests,
            lambda r: decode_texts(input_array(pb_utils, r, "IMAGE_URL"), "IMAGE_URL"),
        )
        try:
            results = fetch_all(batch.items, self.policy, self.pool) if batch.items else []
        except Exception as exc:  # noqa: BLE001 - every request must get a response
            self.logger.log_error(traceback.format_exc())
            return batch.fail_valid(pb_utils, exc, self.logger.log_error)
        for i, start, stop in batch.slices():
            mine = results[start:stop]
            failed = next((r for r in mine if isinstance(r, RequestError)), None)
            if failed is not None:
                batch.responses[i] = error_response(pb_utils, failed)
                continue
            images = np.empty((len(mine), 1), dtype=np.object_)
            images[:, 0] = mine
            batch.responses[i] = pb_utils.InferenceResponse([pb_utils.Tensor("IMAGE", images)])
        return batch.responses

    def finalize(self):
        """Stop the thread pool."""
        self.pool.shutdown(wait=False, cancel_futures=True)
