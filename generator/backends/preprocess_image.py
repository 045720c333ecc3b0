"""Triton Python model ``<name>_preprocess_image``: image bytes -> ``pixel_values``.

Decoding and resizing run on a small thread pool (Pillow releases the GIL) over every
image of every request in the batch; a bad image fails only its own request.
"""

import traceback
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import triton_python_backend_utils as pb_utils
from embed_runtime.adapter import config_parameters, error_response, gather_rows, input_array
from embed_runtime.errors import InvalidInputError, RequestError
from embed_runtime.image import PreprocessParams, decode_image, preprocess


class TritonPythonModel:
    """Decodes, resizes, crops and normalises images exactly like open_clip."""

    def initialize(self, args):
        """Read the preprocessing parameters and start the decode pool."""
        self.logger = pb_utils.Logger
        params = config_parameters(args["model_config"])
        self.params = PreprocessParams.from_parameters(params)
        workers = int(params["decode_threads"])
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="decode")

    def _one(self, data):
        try:
            if not isinstance(data, bytes):
                raise InvalidInputError("IMAGE rows must be BYTES")
            return preprocess(decode_image(data, self.params), self.params)
        except RequestError as exc:
            return exc
        except Exception as exc:  # noqa: BLE001 - reported per request below
            self.logger.log_error(traceback.format_exc())
            return exc

    @staticmethod
    def _rows(request):
        rows = input_array(pb_utils, request, "IMAGE").reshape(-1)
        if rows.size == 0:
            raise InvalidInputError("IMAGE has zero rows")
        return list(rows)

    def execute(self, requests):
        """Preprocess all images at once; slice them back per request."""
        batch = gather_rows(pb_utils, requests, self._rows)
        results = list(self.pool.map(self._one, batch.items))
        for i, start, stop in batch.slices():
            mine = results[start:stop]
            failed = next((r for r in mine if isinstance(r, Exception)), None)
            if failed is not None:
                batch.responses[i] = error_response(pb_utils, failed, self.logger.log_error)
                continue
            pixels = np.stack(mine).astype(np.float32, copy=False)
            batch.responses[i] = pb_utils.InferenceResponse(
                [pb_utils.Tensor("pixel_values", pixels)]
            )
        return batch.responses

    def finalize(self):
        """Stop the decode pool."""
        self.pool.shutdown(wait=False, cancel_futures=True)
