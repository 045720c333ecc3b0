"""Bad text input: the exact status and reason over HTTP and gRPC, each request failing alone."""

from __future__ import annotations

import time

import numpy as np
import pytest

from client import EmbeddingClientError
from tests.integration.conftest import MAX_BATCH, TEXT_MODEL
from tests.integration.text_helpers import (
    INVALID,
    PROTOCOLS,
    assert_bad_requests_fail_alone,
    assert_parity,
    infer_raw,
    raw_client,
    refusal,
    text_tensor,
)

pytestmark = pytest.mark.integration

IN_ENSEMBLE = f"in ensemble '{TEXT_MODEL}', "
MAX_TEXT_BYTES = 16384  # the default
MAX_REQUEST_TEXT_BYTES = 131072  # conftest's manifest
TRITON = "[request id: <id_unknown>] "


@pytest.mark.parametrize(
    ("rows", "reason"),
    [
        (["fine", ""], "TEXT row 1 is empty or whitespace only"),
        (["fine", "  \t\n "], "TEXT row 1 is empty or whitespace only"),
        ([b"ok", b"\xff\xfe"], "TEXT row 1 is not valid UTF-8 (invalid start byte)"),
        ([b"caf\xe9 au lait"], "TEXT row 0 is not valid UTF-8 (invalid continuation byte)"),
        (
            ["a" * (MAX_TEXT_BYTES + 1)],
            f"TEXT row 0 is {MAX_TEXT_BYTES + 1} bytes, over this model's max_text_bytes=16384",
        ),
        (
            ["a" * 16000] * 9,
            "TEXT rows total 144000 bytes, over this model's max_request_text_bytes=131072",
        ),
    ],
    ids=["empty", "whitespace", "non-utf8", "latin-1", "row-over-cap", "request-over-cap"],
)
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_bad_text_is_refused_with_invalid_arg_and_its_reason(server, protocol, rows, reason):
    status, message = refusal(server, protocol, text_tensor(rows))
    assert (status, message) == (INVALID[protocol], IN_ENSEMBLE + reason)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_project_client_surfaces_status_and_message(server, protocol):
    with server.client(protocol) as c, pytest.raises(EmbeddingClientError) as caught:
        c.embed_texts(TEXT_MODEL, ["fine", b"\xff\xfe"])
    reason = "TEXT row 1 is not valid UTF-8 (invalid start byte)"
    assert (caught.value.status, caught.value.message) == (INVALID[protocol], IN_ENSEMBLE + reason)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_text_caps_are_inclusive(server, protocol, reference):
    """A row of exactly max_text_bytes, and rows of exactly max_request_text_bytes, pass."""
    row = "ab " * (MAX_TEXT_BYTES // 3) + "a"
    assert len(row.encode()) == MAX_TEXT_BYTES
    tc = raw_client(server, protocol)
    try:
        got = infer_raw(tc, protocol, text_tensor([row]))
        full = infer_raw(tc, protocol, text_tensor([row] * (MAX_REQUEST_TEXT_BYTES // len(row))))
    finally:
        tc.close()
    want = reference.encode([row], normalize_embeddings=True)
    assert_parity(got, want)
    assert_parity(full, np.repeat(want, 8, axis=0))


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_10_mb_row_is_refused_before_tokenizing(server, protocol):
    """Tokenizing 10 MB takes about 30 s here; the byte cap answers in a fraction of that.

    Idle, the refusal takes milliseconds; the bound is a third of the tokenizing time, so
    a busy machine (sending 10 MB takes longer there) cannot fail it, a tokenizer can.
    """
    start = time.monotonic()
    status, message = refusal(server, protocol, text_tensor([b"a" * 10_000_000]))
    elapsed = time.monotonic() - start
    print(f"\n{protocol}: 10 MB row refused in {elapsed * 1000:.0f} ms")
    assert (status, message) == (
        INVALID[protocol],
        IN_ENSEMBLE + "TEXT row 0 is 10000000 bytes, over this model's max_text_bytes=16384",
    )
    assert elapsed < 10.0


@pytest.mark.parametrize(
    ("array", "kwargs", "reason"),
    [
        (
            text_tensor(["text"] * (MAX_BATCH + 1)),
            {},
            f"{TRITON}inference request batch-size must be <= 16 for '{TEXT_MODEL}'",
        ),
        (
            np.zeros((0, 1), dtype=np.object_),
            {},
            f"{TRITON}expected 1 string elements for inference input 'TEXT' for model "
            f"'{TEXT_MODEL}', got 0",
        ),
        (
            np.zeros((1, 1), dtype=np.float32),
            {"dtype": "FP32"},
            f"{TRITON}inference input 'TEXT' data-type is 'FP32', but model '{TEXT_MODEL}' "
            "expects 'BYTES'",
        ),
        (
            text_tensor(["text"]),
            {"name": "INPUT0"},
            f"unexpected inference input 'INPUT0' for model '{TEXT_MODEL}'",
        ),
    ],
    ids=["too-many-rows", "zero-rows", "wrong-datatype", "wrong-input-name"],
)
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_malformed_request_is_refused_by_triton(server, protocol, array, kwargs, reason):
    status, message = refusal(server, protocol, array, **kwargs)
    assert (status, message) == (INVALID[protocol], reason)


GOOD = ["good one", "another good one, a little longer", "third good", "a fourth good text"]
BAD = {
    b"\xff\xfe": "TEXT row 0 is not valid UTF-8 (invalid start byte)",
    b"caf\xe9 au lait": "TEXT row 0 is not valid UTF-8 (invalid continuation byte)",
    "": "TEXT row 0 is empty or whitespace only",
    "  \t ": "TEXT row 0 is empty or whitespace only",
}


def test_bad_requests_do_not_fail_good_ones_in_the_same_execution(server, reference):
    """Good and bad requests go to the tokenizer together; each gets its own answer."""
    bad = list(BAD)
    # Good and bad alternate over HTTP and gRPC: G B B G G B B G.
    payloads = [GOOD[0], bad[0], bad[1], GOOD[1], GOOD[2], bad[2], bad[3], GOOD[3]]
    want = dict(zip(GOOD, reference.encode(GOOD, normalize_embeddings=True), strict=True))
    assert_bad_requests_fail_alone(server, f"{TEXT_MODEL}_tokenize", payloads, want, BAD)
    with server.client() as c:
        assert c.is_server_ready()
        assert_parity(c.embed_texts(TEXT_MODEL, GOOD[:1]), want[GOOD[0]][None])
