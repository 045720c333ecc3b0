"""One tiny request through every step of every loaded ensemble, for the health check.

A process list says a stub is running, not that it answers: a tokenizer whose files were
damaged, an encoder session in a bad state or a step that hangs all pass it. So the stub
watch (``model_manager``) sends each ready ensemble one small request every
``health_probe_interval_s`` seconds (:data:`PROBE_INTERVAL_S` by default, 0 turns it off;
``embed_runtime.ops.stub_watch.WatchParams``) through the
server's own HTTP endpoint: the text ``"health probe"`` for each text input (``TEXT``,
``QUERY``, ``DOCUMENT``, ...), an 8 x 8 PNG for ``IMAGE``. Ensembles that read a URL
(``IMAGE_URL``) or a non-text input are left out: their probe would need a host the
fetch policy allows. A probe passes when the server answers with every output finite.
A refusal of a bounded queue (``Exceeds maximum queue size``, ``Request timeout
expired``) says the server is busy, not broken, and counts as neither. Two failures in a
row make the ensemble "failing" in the watch's health file until a probe passes again;
``deploy/healthcheck.py`` then reports the replica not ready. When the error names a stub
Triton has declared "not healthy" (it missed Triton's heartbeat: it hangs, or was
stopped) and its process is still there, the watch kills it, and replaces it as any dead
stub (measured: Triton 2.51 aborts with ``boost::interprocess::lock_exception`` if such
a stub resumes instead). The probes show up in
Triton's statistics and metrics like any request (6 a minute per ensemble by default).

``model_manager`` starts while Triton is still loading the startup models, before the
HTTP endpoint listens, and a stopping Triton closes the endpoint before it unloads this
model: so a refused connection is a verbose log line and a retry each second, until the
server first answers, and for :data:`REFUSED_GRACE_S` after it last answered; refusals
that last longer, and every other failure, are logged as errors.
"""

from __future__ import annotations

import io
import json
import math
import re
import struct
import time
import traceback
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field

PROBE_TEXT = "health probe"
PROBE_INTERVAL_S = 10.0  # seconds between two probes of an ensemble, unless configured
FAILURES_TO_FAIL = 2
BUSY = ("Exceeds maximum queue size", "Request timeout expired")
SKIPPED_INPUTS = {"IMAGE_URL"}
UNHEALTHY_STUB = re.compile(r"Stub process '([^']+)' is not healthy")
RETRY_S = 1.0  # how soon a round retries while the server refuses connections
# A server that stops closes its HTTP endpoint first, then unloads its models (this one
# among them) within its exit timeout (--exit-timeout-secs, 30 s by default): refusals
# that last longer than this are a real failure.
REFUSED_GRACE_S = 60.0


class ServerNotListening(Exception):
    """The server's HTTP endpoint refused the probe's connection.

    ``was_up``: it had answered before (a stopping server); ``seconds``: how long it has
    refused so far (0 before it ever answered).
    """

    def __init__(self, reason: str, was_up: bool, seconds: float):
        super().__init__(reason)
        self.reason, self.was_up, self.seconds = reason, was_up, seconds


def probe_png() -> bytes:
    """An 8 x 8 mid-grey RGB PNG."""
    from PIL import Image  # noqa: PLC0415 - serve-time dependency, only when probing

    buffer = io.BytesIO()
    Image.new("RGB", (8, 8), (128, 128, 128)).save(buffer, format="PNG")
    return buffer.getvalue()


def probe_inputs(config: dict, image: bytes) -> list[tuple[str, list[int], bytes]] | None:
    """(name, shape, payload) of each required input of ``config``; None if not probed."""
    if config.get("platform") != "ensemble":
        return None
    batched = int(config.get("max_batch_size", 0)) > 0
    inputs = []
    for spec in config.get("input", []):
        if spec.get("optional"):
            continue
        name = spec["name"]
        if spec.get("data_type") != "TYPE_STRING" or name in SKIPPED_INPUTS:
            return None
        dims = [max(int(d), 1) for d in spec.get("dims", [])]
        shape = ([1] if batched else []) + dims
        if math.prod(shape) != 1:
            return None
        inputs.append((name, shape, image if name == "IMAGE" else PROBE_TEXT.encode()))
    return inputs or None


def infer_body(
    inputs: list[tuple[str, list[int], bytes]], output: str | None = None
) -> tuple[bytes, int]:
    """Triton's binary-tensor HTTP request: (body, length of its JSON header).

    ``output`` names the one output asked for (answered as JSON); without it Triton
    answers every output, and one it cannot write as JSON (FP16) fails the request.
    """
    header: dict = {"inputs": [
        {"name": name, "shape": shape, "datatype": "BYTES",
         "parameters": {"binary_data_size": 4 + len(payload)}}
        for name, shape, payload in inputs
    ]}
    if output:
        header["outputs"] = [{"name": output, "parameters": {"binary_data": False}}]
    head = json.dumps(header).encode()
    tensors = b"".join(struct.pack("<I", len(p)) + p for _, _, p in inputs)
    return head + tensors, len(head)


def answer_problem(reply: dict) -> str:
    """Why an inference reply is not a sound answer, or ""."""
    outputs = reply.get("outputs") or []
    if not outputs:
        return "the reply holds no output"
    for output in outputs:
        data = output.get("data")
        if not data:
            return f"output {output.get('name')} is empty"
        if any(isinstance(v, float) and not math.isfinite(v) for v in data):
            return f"output {output.get('name')} is not finite"
    return ""


@dataclass
class ProbeState:
    """One ensemble's probe record."""

    failures_in_a_row: int = 0
    error: str = ""
    last_ok: float = 0.0
    failed_at: float = 0.0  # the probe's clock at the latest failure


@dataclass
class EnsembleProbe:
    """Probes every ready ensemble each ``interval_s`` (see the module doc).

    ``call(path, body)`` is the repository API (index and configs); ``infer(model, body,
    header_length)`` sends one request and returns the reply's JSON, raising with the
    server's message on an error.
    """

    call: Callable[[str, dict | None], bytes]
    infer: Callable[[str, bytes, int], dict]
    interval_s: float = PROBE_INTERVAL_S
    clock: Callable[[], float] = time.monotonic
    states: dict[str, ProbeState] = field(default_factory=dict)
    configs: dict[str, dict] = field(default_factory=dict)
    next_at: float = 0.0
    image: bytes = b""
    handled: set[tuple[str, str]] = field(default_factory=set)
    server_answered: bool = False  # the server's HTTP endpoint has answered once
    refused_since: float | None = None  # when it began refusing, after it had answered

    def due(self) -> bool:
        """Whether a round of probes is due."""
        return self.interval_s > 0 and self.clock() >= self.next_at

    def run(self) -> None:
        """One probe of every ready ensemble."""
        self.next_at = self.clock() + self.interval_s
        try:
            reply = self.call("/v2/repository/index", {"ready": True})
        except urllib.error.HTTPError:
            self._answered()  # an answer, though an error: the server is up
            raise
        except (urllib.error.URLError, ConnectionError) as exc:
            self._refused(str(getattr(exc, "reason", exc)))
            raise
        self._answered()
        index = json.loads(reply)
        ready = sorted({m["name"] for m in index if m.get("state") == "READY"})
        for gone in set(self.states) - set(ready):
            del self.states[gone]
        for gone in set(self.configs) - set(ready):  # unloaded: its next config may differ
            del self.configs[gone]
        for model in ready:
            if model not in self.configs:
                self.configs[model] = json.loads(self.call(f"/v2/models/{model}/config", None))
            if not self.image:
                self.image = probe_png()
            inputs = probe_inputs(self.configs[model], self.image)
            if inputs is not None:
                self._probe(model, inputs)

    def _probe(self, model: str, inputs) -> None:
        state = self.states.setdefault(model, ProbeState())
        outputs = self.configs[model].get("output") or [{}]
        body, header_length = infer_body(inputs, outputs[0].get("name"))
        # A failure is dated when its request was sent: the stub that failed it served
        # then, so one a reload started while the request was out is not the one named.
        sent = self.clock()
        try:
            problem = answer_problem(self.infer(model, body, header_length))
        except Exception as exc:  # noqa: BLE001 - any failure is the probe's finding
            problem = str(exc) or type(exc).__name__
            if any(b in problem for b in BUSY):
                return
        if problem:
            state.failures_in_a_row += 1
            state.error, state.failed_at = problem[:300], sent
        else:
            state.failures_in_a_row, state.error, state.last_ok = 0, "", time.time()
            self.handled = {h for h in self.handled if h[0] != model}

    def _answered(self) -> None:
        self.server_answered, self.refused_since = True, None

    def _refused(self, reason: str) -> None:
        """Raise :class:`ServerNotListening` (retried soon) unless refusals are a failure."""
        now = self.clock()
        if self.server_answered:
            self.refused_since = now if self.refused_since is None else self.refused_since
            if now - self.refused_since >= REFUSED_GRACE_S:
                return  # the caller raises the refusal itself: a real failure
        self.next_at = now + min(self.interval_s, RETRY_S)
        seconds = now - self.refused_since if self.refused_since is not None else 0.0
        raise ServerNotListening(reason, self.server_answered, seconds)

    def hung_instances(self) -> dict[str, float]:
        """Stub instances named "not healthy" by failing ensembles, once each: when last.

        Each maps to the probe's clock at the latest failure that named it.
        An instance is returned again only after its ensemble answered a probe: the
        replacement of a killed stub has the same instance name (and the watch kills no
        stub it started after that error: ``StubWatch.end_hung``).
        """
        found = {(model, match.group(1)) for model, error in self.failing().items()
                 for match in UNHEALTHY_STUB.finditer(error)}
        new = found - self.handled
        self.handled |= new
        hung: dict[str, float] = {}
        for model, instance in sorted(new):
            hung[instance] = max(hung.get(instance, 0.0), self.states[model].failed_at)
        return hung

    def failing(self) -> dict[str, str]:
        """Ensembles whose last probes failed: name -> the latest error."""
        return {m: s.error for m, s in sorted(self.states.items())
                if s.failures_in_a_row >= FAILURES_TO_FAIL}


@dataclass
class ProbeLoop:
    """The probe thread of ``model_manager``: rounds of :class:`EnsembleProbe`, logged.

    ``watch`` is the stub watch (``failing_probes`` for its health file, ``end_hung``);
    ``logger`` has ``log_error`` / ``log_warn`` / ``log_info`` / ``log_verbose`` (the
    Python backend's ``pb_utils.Logger``).
    """

    probe: EnsembleProbe
    watch: object
    logger: object
    quiet_logged: str = ""  # the verbose line of the refusals now going on, once each

    def run(self, stopped: Callable[[float], bool], tick_s: float = 1.0) -> None:
        """A round whenever one is due, until ``stopped(tick_s)`` (``Event.wait``) is true."""
        while not stopped(tick_s):
            self.round()

    def round(self) -> None:
        """One round if due: probe, update the watch, log what changed."""
        if not self.probe.due():
            return
        before = self.probe.failing()
        try:
            self.probe.run()
            self.quiet_logged = ""
        except ServerNotListening as exc:
            line = ("waiting for the server to listen" if not exc.was_up else
                    "the server stopped answering (it does while it stops)")
            if self.quiet_logged != line:
                self.logger.log_verbose(f"health probe: {line} ({exc.reason})")
                self.quiet_logged = line
            return
        except urllib.error.HTTPError as exc:
            self.logger.log_error(f"health probe: the server answered {exc.code}: {exc.reason}")
        except (urllib.error.URLError, ConnectionError) as exc:
            reason = getattr(exc, "reason", None) or exc
            self.logger.log_error(
                f"health probe: the server has refused connections for {REFUSED_GRACE_S:g} s "
                f"or more, after it had answered: {reason}"
            )
        except Exception:  # noqa: BLE001 - the probe must outlive one bad round
            self.logger.log_error(traceback.format_exc())
        self.watch.failing_probes = now = self.probe.failing()
        for model in sorted(set(now) - set(before)):
            self.logger.log_error(f"health probe of {model} failing: {now[model]}")
        killed = self.watch.end_hung(self.probe.hung_instances())
        if killed:
            self.logger.log_warn(f"health probe: Triton reports {', '.join(killed)} not "
                                 "healthy while the process runs (hung); killed it")
        for model in sorted(set(before) - set(now)):
            self.logger.log_info(f"health probe of {model} passes again")


def http_infer(base_url: str, opener, timeout_s: float = 10.0):
    """``infer`` for :class:`EnsembleProbe` over the server's own HTTP endpoint."""
    def infer(model: str, body: bytes, header_length: int) -> dict:
        request = urllib.request.Request(  # noqa: S310 - the server's own loopback URL
            f"{base_url}/v2/models/{model}/infer", data=body, method="POST",
            headers={"Inference-Header-Content-Length": str(header_length),
                     "Content-Type": "application/octet-stream"},
        )
        try:
            with opener.open(request, timeout=timeout_s) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as exc:
            try:
                message = json.loads(exc.read()).get("error", "")
            except ValueError:
                message = ""
            raise RuntimeError(message or f"HTTP {exc.code}") from None

    return infer
