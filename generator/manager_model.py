"""Triton Python model ``model_manager``: load, unload, delete and list models at runtime.

``REQUEST`` is one JSON object (see :mod:`generator.lifecycle`); ``RESPONSE`` is the
JSON answer. Every request must carry the server's admin key (``X-Admin-Key``, which
Triton forwards as a request parameter); without ``EMBED_ADMIN_KEY`` /
``EMBED_ADMIN_KEY_FILE`` in the server's environment every request is refused. Needs
the generator package (and torch for exports) in the Python that runs this model, and
Triton in explicit model-control mode.

It also runs the server's stub watch (``embed_runtime``'s ``stub_watch``): a thread that
looks at the server's Python-backend stubs every ``stub_watch_interval_s`` seconds and
reloads the model of any stub that died, through the server's own repository API; and a
second thread that sends every ensemble one tiny request each
``health_probe_interval_s`` seconds (``embed_runtime``'s ``probe``).
"""

import json
import os
import threading
import traceback
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils
from generator.admin import AdminKeyError, configured_admin_key
from generator.lifecycle import ManagerParams, ModelManager, parse_request
from generator.manager_config import ManagerConfig
from embed_runtime.serving.adapter import config_parameters, error_response, input_array
from embed_runtime.errors import InvalidInputError, RequestError
from embed_runtime.ops.probe import EnsembleProbe, ProbeLoop, http_infer
from embed_runtime.ops.server_exit import exit_with_server
from embed_runtime.ops.stub_watch import (
    RepositoryApi,
    StubWatch,
    health_path,
    server_http_url,
)
from generator.triton_local import SERVER_KEY_ENV


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
        exit_with_server()
        self.logger = pb_utils.Logger
        repo = Path(args["model_repository"]).resolve().parent
        try:
            key = configured_admin_key()
        except AdminKeyError as exc:
            self.logger.log_error(f"model_manager disabled: {exc}")
            key = None
        raw = config_parameters(args["model_config"])
        params = ManagerParams.from_parameters(raw, repo, admin_key=key)
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        self.manager = ModelManager(params, _TritonControl())
        self._stop = threading.Event()
        self.watch = None
        watch = ManagerConfig.from_parameters(raw)
        interval = watch.stub_watch_interval_s
        probe_interval = watch.health_probe_interval_s
        server_key = os.environ.get(SERVER_KEY_ENV, "")
        if interval > 0 and server_key:
            server_pid = os.getppid()  # a stub's parent is tritonserver
            http_url = server_http_url(server_pid)
            api = RepositoryApi(http_url, server_key)
            self.watch = StubWatch(
                server_pid,
                api.is_ready,
                api.reload,
                args["model_name"],
                health_file=health_path(http_url.rsplit(":", 1)[1]),
                configured=api.python_instances,
            )
            self.probe = EnsembleProbe(
                api.call, http_infer(api.base, api.opener), interval_s=probe_interval
            )
            threading.Thread(target=self._watch, args=(interval,), daemon=True).start()
            if probe_interval > 0:
                threading.Thread(target=self._probe_loop, daemon=True).start()
        elif interval > 0:
            self.logger.log_warn(f"stub watch off: {SERVER_KEY_ENV} is not set")

    def _watch(self, interval):
        """Poll the stubs until finalize; log every reload."""
        reported = 0
        while not self._stop.wait(interval):
            try:
                self.watch.poll()
            except Exception:  # noqa: BLE001 - the watch must outlive one bad poll
                self.logger.log_error(traceback.format_exc())
            for model, instances, seconds, error in self.watch.events[reported:]:
                outcome = f"failed: {error}" if error else f"reloaded in {seconds:.2f} s"
                self.logger.log_warn(
                    f"stub watch: {', '.join(instances)} of {model} died; {outcome}"
                )
            reported = len(self.watch.events)

    def _probe_loop(self):
        """Probe every ensemble until finalize (:class:`ProbeLoop`).

        Its own thread: a slow probe must not hold up the stub watch.
        """
        ProbeLoop(self.probe, self.watch, self.logger).run(self._stop.wait)

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
        """Stop the stub watch; builds run in short-lived worker processes."""
        self._stop.set()
        self.manager = None
