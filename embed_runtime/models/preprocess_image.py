"""Triton Python model ``<name>_preprocess_image``: image bytes -> ``pixel_values``.

Each ``execute`` first reads every image's header (no pixel decoded) and admits requests
in order against the per-execution pixel budget ``max_batch_pixels``; only then does a
small thread pool (Pillow releases the GIL) decode and resize the admitted images. With
``image_decode = gpu`` the admitted JPEGs are decoded and resized on this instance's GPU
in one batch (``embed_runtime.image.gpu``) and the rest take the pool. A bad or
over-budget image fails only its own request; every request gets one response.
"""

import traceback
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import triton_python_backend_utils as pb_utils
from embed_runtime.serving.adapter import (
    config_parameters,
    error_response,
    gather_rows,
    input_array,
    with_tickets,
)
from embed_runtime.errors import InvalidInputError, RequestError
from embed_runtime.image.preprocess import (
    PixelBudget,
    PreprocessParams,
    open_image,
    preprocess_opened,
)
from embed_runtime.image.gpu import cuda_preprocessor
from embed_runtime.ops.backlog_board import EncoderSlot, board_path
from embed_runtime.ops.priority import lower_priority
from embed_runtime.ops.server_exit import exit_with_server, is_stub
from embed_runtime.serving.admission import (
    BACKLOG_PARAMETER,
    AdmissionGate,
    Taken,
    wall_clock_us,
)


class TritonPythonModel:
    """Decodes, resizes, crops and normalises images exactly like open_clip."""

    def initialize(self, args):
        """Read the preprocessing parameters and start the decode pool."""
        exit_with_server()
        lower_priority()  # before the decode pool starts (embed_runtime.ops.priority)
        self.logger = pb_utils.Logger
        params = config_parameters(args["model_config"])
        self.params = PreprocessParams.from_parameters(params)
        workers = int(params["decode_threads"])
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="decode")
        self.gpu = None
        if self.params.image_decode == "gpu":
            device_id = int(args.get("model_instance_device_id") or 0)
            self.gpu = cuda_preprocessor(self.params, device_id, self.pool.map)
            name = args["model_name"]
            self.logger.log_info(f"{name}: JPEG decode and resize on cuda:{device_id}")
        self.gate = AdmissionGate.from_parameters(
            params, args["model_version"], pb_utils, args["model_name"]
        )
        # Counted by the admit step in front (embed_runtime/models/admit_image.py): the
        # requests this instance takes and what one costs. Only inside Triton, whose
        # server the board is named by.
        self.backlog = None
        if params.get(BACKLOG_PARAMETER) == "true" and is_stub():
            version = args["model_version"]
            self.backlog = EncoderSlot(board_path(args["model_name"], version))

    def _guarded(self, step, item):
        """``step(item, params)``, or the exception it raised (unexpected ones logged)."""
        try:
            return step(item, self.params)
        except RequestError as exc:
            return exc
        except Exception as exc:  # noqa: BLE001 - reported per request below
            self.logger.log_error(traceback.format_exc())
            return exc

    def _decode_all(self, images):
        """Every admitted image through the pool: pixel arrays or per-image exceptions."""
        try:
            return list(self.pool.map(self._guarded, [preprocess_opened] * len(images), images))
        except Exception as exc:  # noqa: BLE001 - an unusable pool fails these images only
            self.logger.log_error(traceback.format_exc())
            return [exc] * len(images)

    def _gpu_all(self, images, datas):
        """The admitted images through the GPU path (its CPU fallback included)."""
        try:
            return self.gpu.run(images, datas)
        except Exception as exc:  # noqa: BLE001 - a device failure fails these images only
            self.logger.log_error(traceback.format_exc())
            return [exc] * len(images)

    @staticmethod
    def _rows(request):
        rows = input_array(pb_utils, request, "IMAGE").reshape(-1)
        if rows.size == 0:
            raise InvalidInputError("IMAGE has zero rows")
        return list(rows)

    def _fail(self, batch, i, exc):
        batch.responses[i] = error_response(pb_utils, exc, self.logger.log_error)

    def _admit(self, batch, opened):
        """Requests whose headers are good and fit the pixel budget, in request order."""
        budget = PixelBudget(self.params.max_batch_pixels)
        admitted = []
        for i, start, stop in batch.slices():
            mine = opened[start:stop]
            failed = next((r for r in mine if isinstance(r, Exception)), None)
            if failed is None:
                try:
                    budget.charge(sum(image.width * image.height for image in mine), len(mine))
                    admitted.append((i, mine, batch.items[start:stop]))
                except RequestError as exc:
                    failed = exc
            if failed is not None:
                self._fail(batch, i, failed)
        return admitted

    def _respond(self, batch, i, results):
        """The request's output tensors, or ``None`` with its error response set."""
        failed = next((r for r in results if isinstance(r, Exception)), None)
        if failed is None:
            try:
                stacked = np.stack(results) if self.gpu is None else self.gpu.to_host(results)
                return [pb_utils.Tensor("pixel_values", stacked)]
            except Exception as exc:  # noqa: BLE001 - every request must get a response
                failed = exc
        self._fail(batch, i, failed)
        return None

    def execute(self, requests):
        """Read headers, admit within budget, decode the admitted images; slice back."""
        if self.backlog is None:
            return self._execute(requests)
        taken = Taken.read(pb_utils, requests, "IMAGE")
        with self.backlog.executing(taken.features(), taken.ticket, taken.work_ticket):
            responses = self._execute(requests)
        now = wall_clock_us()
        self.backlog.observe(taken.ratios(now))
        self.backlog.observe_fixed(taken.residuals(now))
        return responses

    def _execute(self, requests):
        batch = gather_rows(pb_utils, requests, self._rows, self.gate)
        opened = [self._guarded(open_image, data) for data in batch.items]
        admitted = self._admit(batch, opened)
        images = [image for _, mine, _ in admitted for image in mine]
        if self.gpu is None:
            results = self._decode_all(images)
        else:
            datas = [data for _, _, mine in admitted for data in mine]
            results = self._gpu_all(images, datas)
        start, outputs = 0, {}
        for i, mine, _ in admitted:
            outputs[i] = self._respond(batch, i, results[start : start + len(mine)])
            start += len(mine)
        outputs = {i: tensors for i, tensors in outputs.items() if tensors is not None}
        for i, tensors in with_tickets(pb_utils, self.gate, batch, outputs).items():
            batch.responses[i] = pb_utils.InferenceResponse(tensors)
        return batch.responses

    def finalize(self):
        """Stop the decode pool; free this instance's admission slot."""
        self.pool.shutdown(wait=False, cancel_futures=True)
        if self.gate is not None:
            self.gate.close()
        if self.backlog is not None:
            self.backlog.close()
