"""The ensemble health probe (embed_runtime/ops/probe.py): requests, verdicts, state."""

from __future__ import annotations

import json
import struct
import urllib.error

from embed_runtime.ops import probe as p

TEXT = {"platform": "ensemble", "max_batch_size": 16,
        "input": [{"name": "TEXT", "data_type": "TYPE_STRING", "dims": [1]},
                  {"name": "PROMPT", "data_type": "TYPE_STRING", "dims": [1], "optional": True}]}
PAIRS = {"platform": "ensemble", "max_batch_size": 8,
         "input": [{"name": "QUERY", "data_type": "TYPE_STRING", "dims": [1]},
                   {"name": "DOCUMENT", "data_type": "TYPE_STRING", "dims": [1]}]}
IMAGE = {"platform": "ensemble", "max_batch_size": 8,
         "input": [{"name": "IMAGE", "data_type": "TYPE_STRING", "dims": [1]}]}
URL = {"platform": "ensemble", "max_batch_size": 8,
       "input": [{"name": "IMAGE_URL", "data_type": "TYPE_STRING", "dims": [1]}]}


def test_each_required_text_input_gets_the_probe_text_and_images_a_png() -> None:
    assert p.probe_inputs(TEXT, b"png") == [("TEXT", [1, 1], b"health probe")]
    assert [i[0] for i in p.probe_inputs(PAIRS, b"png")] == ["QUERY", "DOCUMENT"]
    assert p.probe_inputs(IMAGE, b"png") == [("IMAGE", [1, 1], b"png")]
    png = p.probe_png()
    assert png.startswith(b"\x89PNG") and len(png) < 200


def test_url_inputs_non_text_inputs_and_steps_are_not_probed() -> None:
    assert p.probe_inputs(URL, b"png") is None
    assert p.probe_inputs({**TEXT, "platform": ""}, b"png") is None
    numeric = {"platform": "ensemble", "max_batch_size": 4,
               "input": [{"name": "IDS", "data_type": "TYPE_INT64", "dims": [-1]}]}
    assert p.probe_inputs(numeric, b"png") is None


def test_the_request_is_tritons_binary_tensor_format() -> None:
    body, head = p.infer_body([("QUERY", [1, 1], b"ab"), ("DOCUMENT", [1, 1], b"xyz")])
    header = json.loads(body[:head])
    assert [(i["name"], i["datatype"], i["parameters"]["binary_data_size"])
            for i in header["inputs"]] == [("QUERY", "BYTES", 6), ("DOCUMENT", "BYTES", 7)]
    assert body[head:] == struct.pack("<I", 2) + b"ab" + struct.pack("<I", 3) + b"xyz"
    assert "outputs" not in header


def test_the_probe_asks_for_the_ensembles_first_output_only() -> None:
    """Every output would include ones Triton cannot write as JSON (FP16 forms)."""
    body, head = p.infer_body([("TEXT", [1, 1], b"x")], "EMBEDDING")
    header = json.loads(body[:head])
    assert header["outputs"] == [{"name": "EMBEDDING", "parameters": {"binary_data": False}}]


def test_an_answer_must_hold_finite_outputs() -> None:
    assert p.answer_problem({"outputs": [{"name": "EMBEDDING", "data": [0.1, -0.2]}]}) == ""
    assert "no output" in p.answer_problem({"outputs": []})
    assert "empty" in p.answer_problem({"outputs": [{"name": "E", "data": []}]})
    assert "not finite" in p.answer_problem({"outputs": [{"name": "E", "data": [float("nan")]}]})


class Server:
    """Index and configs of a fake server; ``infer`` answers from ``replies``."""

    def __init__(self, models: dict[str, dict]):
        self.models = models
        self.replies: dict[str, object] = {}
        self.sent: list[str] = []
        self.headers: list[dict] = []

    def call(self, path: str, body: dict | None) -> bytes:
        if path == "/v2/repository/index":
            return json.dumps([{"name": m, "state": "READY"} for m in self.models]).encode()
        return json.dumps(self.models[path.split("/")[3]]).encode()

    def infer(self, model: str, body: bytes, head: int) -> dict:
        self.sent.append(model)
        self.headers.append(json.loads(body[:head]))
        reply = self.replies.get(model, {"outputs": [{"name": "EMBEDDING", "data": [0.5]}]})
        if isinstance(reply, Exception):
            raise reply
        return reply


def _probe(server: Server) -> p.EnsembleProbe:
    now = [0.0]
    probe = p.EnsembleProbe(server.call, server.infer, interval_s=10, clock=lambda: now[0])
    probe.now = now
    return probe


def test_two_failures_in_a_row_make_an_ensemble_failing_until_it_passes() -> None:
    server = Server({"t": TEXT, "t_encode": {"platform": ""}, "c_image_url": URL})
    probe = _probe(server)
    probe.run()
    assert server.sent == ["t"] and probe.failing() == {}
    dead = "in ensemble 't', Stub process 't_encode_0_0' is not healthy"
    server.replies["t"] = RuntimeError(dead)
    probe.run()
    assert probe.failing() == {}
    probe.run()
    assert probe.failing() == {"t": dead}
    del server.replies["t"]
    probe.run()
    assert probe.failing() == {}


def test_a_probe_of_an_ensemble_with_an_fp16_output_asks_for_its_first_output() -> None:
    """Asked for no output, Triton would answer all as JSON and fail on the FP16 one."""
    outputs = [{"name": "EMBEDDING", "data_type": "TYPE_FP32"},
               {"name": "EMBEDDING_FP16", "data_type": "TYPE_FP16"}]
    server = Server({"t": {**TEXT, "output": outputs}})
    _probe(server).run()
    assert server.headers[0]["outputs"] == [
        {"name": "EMBEDDING", "parameters": {"binary_data": False}}
    ]


def test_a_busy_refusal_is_neither_a_failure_nor_a_pass() -> None:
    server = Server({"t": TEXT})
    probe = _probe(server)
    server.replies["t"] = RuntimeError("boom")
    probe.run()
    server.replies["t"] = RuntimeError("in ensemble 't', Exceeds maximum queue size")
    probe.run()
    assert probe.states["t"].failures_in_a_row == 1
    server.replies["t"] = RuntimeError("boom")
    probe.run()
    assert probe.failing() == {"t": "boom"}


def test_probes_follow_the_interval_and_forget_unloaded_models() -> None:
    server = Server({"t": TEXT})
    probe = _probe(server)
    assert probe.due()
    probe.run()
    assert not probe.due()
    probe.now[0] = 10.0
    assert probe.due()
    server.replies["t"] = RuntimeError("x")
    probe.run()
    probe.run()
    assert probe.failing()
    server.models = {}
    probe.run()
    assert probe.failing() == {} and probe.configs == {}
    assert not p.EnsembleProbe(server.call, server.infer, interval_s=0).due()


def test_a_stub_reported_not_healthy_is_named_once_until_its_ensemble_answers() -> None:
    server = Server({"t": TEXT})
    probe = _probe(server)
    server.replies["t"] = RuntimeError("in 't', Stub process 't_encode_0_1' is not healthy.")
    probe.run()
    assert probe.hung_instances() == {}  # one failure is not yet failing
    probe.run()
    assert set(probe.hung_instances()) == {"t_encode_0_1"}
    probe.run()
    assert probe.hung_instances() == {}  # its replacement has the same name
    del server.replies["t"]
    probe.run()
    server.replies["t"] = RuntimeError("Stub process 't_encode_0_1' is not healthy.")
    probe.run()
    probe.run()
    assert probe.hung_instances() == {"t_encode_0_1": probe.states["t"].failed_at}


def test_a_failure_is_dated_when_its_request_was_sent() -> None:
    """A reload that ends while a probe is out: the failure names the stub it replaced."""
    server = Server({"t": TEXT})
    probe = _probe(server)

    def slow_failure(model: str, body: bytes, head: int) -> dict:
        probe.now[0] += 5.0  # the answer comes 5 s later, a reload ended meanwhile
        raise RuntimeError("Stub process 't_tokenize_0_0' is not healthy.")

    probe.infer = slow_failure
    probe.now[0] = 100.0
    probe.run()
    probe.now[0] = 200.0
    probe.run()
    assert probe.hung_instances() == {"t_tokenize_0_0": 200.0}  # sent at 200, not 205


def test_the_watch_kills_a_hung_stub_of_its_server_only(tmp_path) -> None:
    import subprocess
    import sys

    from embed_runtime.ops.stub_watch import StubWatch

    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        proc = tmp_path / "proc"
        for pid, parent in ((sleeper.pid, 4242), (sleeper.pid + 100000, 999)):
            (proc / str(pid)).mkdir(parents=True)
            args = ["/x/triton_python_backend_stub", "/r/t_encode/1/model.py", "region", "1",
                    "1", str(parent), "/b", "ipc", "t_encode_0_1", "DEFAULT"]
            (proc / str(pid) / "cmdline").write_bytes(b"\0".join(a.encode() for a in args))
            (proc / str(pid) / "stat").write_text(f"{pid} (stub) S 1")
        watch = StubWatch(4242, lambda m: True, lambda m: None, proc=str(proc))
        assert watch.end_hung({"t_encode_0_0": 1.0}) == []
        watch.reloaded_at["t_encode"] = 2.0  # a reload after the report: not the one named
        assert watch.end_hung({"t_encode_0_1": 1.0}) == []
        assert watch.end_hung({"t_encode_0_1": 3.0}) == ["t_encode_0_1"]
        assert sleeper.wait(timeout=10) == -9
    finally:
        sleeper.kill()


# --- the probe thread (ProbeLoop): quiet until the server first answers ------------------


REFUSED = urllib.error.URLError(ConnectionRefusedError(111, "Connection refused"))


class Logger:
    """Records ``(level, message)`` as ``pb_utils.Logger`` would print them."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, str]] = []

    def __getattr__(self, name: str):
        if not name.startswith("log_"):
            raise AttributeError(name)
        return lambda message: self.lines.append((name.removeprefix("log_"), message))

    def at(self, *levels: str) -> list[str]:
        return [m for level, m in self.lines if level in levels]


class Watch:
    def __init__(self) -> None:
        self.failing_probes: dict[str, str] = {}

    def end_hung(self, instances: dict[str, float]) -> list[str]:
        return sorted(instances)


class NotListeningYet(Server):
    """Refuses connections until ``up`` is set (Triton still loading its models)."""

    def __init__(self, models: dict[str, dict]):
        super().__init__(models)
        self.up = False
        self.calls = 0

    def call(self, path: str, body: dict | None) -> bytes:
        self.calls += 1
        if not self.up:
            raise REFUSED
        return super().call(path, body)


def _loop(server: Server) -> tuple[p.ProbeLoop, Logger, Watch]:
    logger, watch = Logger(), Watch()
    return p.ProbeLoop(_probe(server), watch, logger), logger, watch


def test_the_probe_waits_quietly_for_the_server_to_listen_then_probes() -> None:
    server = NotListeningYet({"t": TEXT})
    loop, logger, _ = _loop(server)
    for second in range(30):  # 30 s of startup, one tick a second
        loop.probe.now[0] = float(second)
        loop.round()
    assert server.calls == 30, "retried each second, not each 10 s interval"
    assert logger.at("error", "warn", "info") == []
    assert len(logger.at("verbose")) == 1
    assert "waiting for the server" in logger.at("verbose")[0]
    assert "Connection refused" in logger.at("verbose")[0]
    assert server.sent == []
    server.up = True
    loop.probe.now[0] = 30.0
    loop.round()
    assert server.sent == ["t"] and logger.at("error", "warn") == []
    assert not loop.probe.due(), "then the probe's own interval again"


def test_refusals_of_a_stopping_server_are_quiet_for_a_grace_then_an_error() -> None:
    server = NotListeningYet({"t": TEXT})
    server.up = True
    loop, logger, _ = _loop(server)
    loop.round()
    server.up = False  # Triton closed its endpoint: it stops, or it broke
    start = 10.0
    for second in range(int(p.REFUSED_GRACE_S)):
        loop.probe.now[0] = start + second
        loop.round()
    assert logger.at("error", "warn") == []
    assert logger.at("verbose") == [
        "health probe: the server stopped answering (it does while it stops) "
        "([Errno 111] Connection refused)"
    ]
    loop.probe.now[0] = start + p.REFUSED_GRACE_S
    loop.round()
    assert logger.at("error") == [
        "health probe: the server has refused connections for 60 s or more, after it had "
        "answered: [Errno 111] Connection refused"
    ]
    assert not any("Traceback" in line for _, line in logger.lines)
    assert loop.probe.next_at == start + p.REFUSED_GRACE_S + 10, "then the normal interval"
    server.up = True
    loop.probe.now[0] += 10
    loop.round()
    assert loop.probe.refused_since is None and server.sent == ["t", "t"]
    server.up = False  # a new outage starts a new grace, and a new quiet line
    loop.probe.now[0] += 10
    loop.round()
    assert len(logger.at("error")) == 1 and len(logger.at("verbose")) == 2


def test_an_http_error_counts_as_an_answer_and_is_logged() -> None:
    server = Server({"t": TEXT})
    loop, logger, _ = _loop(server)
    loop.probe.call = lambda path, body: (_ for _ in ()).throw(
        urllib.error.HTTPError(path, 500, "boom", {}, None)
    )
    loop.round()
    assert loop.probe.server_answered
    assert logger.at("error") == ["health probe: the server answered 500: boom"]


def test_an_unexpected_error_in_a_round_is_logged_with_its_traceback() -> None:
    server = Server({"t": TEXT})
    loop, logger, _ = _loop(server)
    loop.probe.call = lambda path, body: b"not json"
    loop.round()
    (error,) = logger.at("error")
    assert error.startswith("Traceback") and "JSONDecodeError" in error


def test_the_loop_reports_failing_and_recovered_ensembles_and_hung_stubs() -> None:
    server = Server({"t": TEXT})
    loop, logger, watch = _loop(server)
    hung = "in ensemble 't', Stub process 't_encode_0_0' is not healthy"
    server.replies["t"] = RuntimeError(hung)
    ticks = []

    def stopped(tick_s: float) -> bool:
        ticks.append(tick_s)
        loop.probe.now[0] += 10.0
        return len(ticks) > 2

    loop.run(stopped)
    assert len(ticks) == 3
    assert watch.failing_probes == {"t": server.replies["t"].args[0]}
    assert logger.at("error") == [f"health probe of t failing: {server.replies['t']}"]
    assert logger.at("warn") == [
        "health probe: Triton reports t_encode_0_0 not healthy while the process runs "
        "(hung); killed it"
    ]
    del server.replies["t"]
    loop.probe.now[0] += 10.0
    loop.round()
    assert watch.failing_probes == {}
    assert logger.at("info") == ["health probe of t passes again"]
