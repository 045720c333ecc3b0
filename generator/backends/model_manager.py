"""Triton Python model ``model_manager``: load, unload, delete and list models at runtime.

``REQUEST`` is one JSON object (see :mod:`generator.lifecycle`); ``RESPONSE`` is the
JSON answer. Every request must carry the server's admin key (``X-Admin-Key``, which
Triton forwards as a request parameter); without ``EMBED_ADMIN_KEY`` /
``EMBED_ADMIN_KEY_FILE`` in the server's environment every request is refused. Needs
the generator package (and torch for exports) in the Python that runs this model, and
Triton in explicit model-control mode.
"""

import json
import os
import traceback
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils
from generator.admin import AdminKeyError, configured_admin_key
from generator.lifecycle import ManagerParams, ModelManager, parse_request
from generator.runtime.adapter import config_parameters, error_response, input_array
from generator.runtime.errors import InvalidInputError, RequestError


class _TritonControl:
    """The model-control calls of the Python backend."""

    def load(self, name: str) -> None:
        pb_utils.load_model(model_name=name)

    def unload(self, name: str) -> None:
        pb_utils.unload_model(model_name=name, unload_dependents=False)

    def is_ready(self, name: str) -> bool:
        return bool(pb_utils.is_model_ready(model_name=name))


class TritonPythonModel:
    """Runs one lifecycle action per request, in arrival order."""

    def initialize(self, args):
        """Read where the repository and manifest are, and the admin key."""
        self.logger = pb_utils.Logger
        repo = Path(args["model_repository"]).resolve().parent
        try:
            key = configured_admin_key()
        except AdminKeyError as exc:
            self.logger.log_error(f"model_manager disabled: {exc}")
            key = None
        params = ManagerParams.from_parameters(
            config_parameters(args["model_config"]), repo, admin_key=key
        )
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        self.manager = ModelManager(params, _TritonControl())

    def _answer(self, request):
        try:
            parameters = json.loads(request.parameters() or "{}")
        except json.JSONDecodeError:
            parameters = {}
        self.manager.authorize(parameters if isinstance(parameters, dict) else {})
        rows = input_array(pb_utils, request, "REQUEST").reshape(-1)
        if rows.size != 1:
            raise InvalidInputError("REQUEST must hold exactly one JSON object")
        answer = self.manager.handle(parse_request(rows[0]))
        out = np.array([json.dumps(answer).encode()], dtype=np.object_)
        return pb_utils.InferenceResponse([pb_utils.Tensor("RESPONSE", out)])

    def execute(self, requests):
        """One response per request; failures are that request's error."""
        responses = []
        for request in requests:
            try:
                responses.append(self._answer(request))
            except RequestError as exc:
                self.logger.log_warn(f"model_manager: {exc.message}")
                responses.append(error_response(pb_utils, exc))
            except Exception as exc:  # noqa: BLE001 - every request must get a response
                self.logger.log_error(traceback.format_exc())
                message = f"model_manager failed: {type(exc).__name__}: {exc}"
                responses.append(error_response(pb_utils, RequestError(message[:1000])))
        return responses

    def finalize(self):
        """Nothing to release: builds run in short-lived worker processes."""
        self.manager = None
