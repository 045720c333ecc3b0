"""``embed_runtime/serving/adapter.py``: config parameters, error responses, input arrays."""

from __future__ import annotations

import json

import numpy as np
import pytest

from embed_runtime.errors import InvalidInputError, RequestError, UnavailableError
from embed_runtime.serving.adapter import config_parameters, error_response, input_array
from tests.unit import fake_pb_utils as pb
from tests.unit.embed_runtime.models.helpers import (
    _error,
    _token_request,
)


def test_config_parameters_reads_string_values_from_json_or_dict() -> None:
    config = {"parameters": {"a": {"string_value": "1"}, "b": {"string_value": "x"}}}
    assert config_parameters(json.dumps(config)) == {"a": "1", "b": "x"}
    assert config_parameters(config) == {"a": "1", "b": "x"}
    assert config_parameters("{}") == {}


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (InvalidInputError("bad row"), pb.TritonError.INVALID_ARG),
        (UnavailableError("host down"), pb.TritonError.UNAVAILABLE),
        (RequestError("other"), pb.TritonError.INTERNAL),
    ],
)
def test_error_response_maps_request_errors_to_codes_keeping_message(exc, code) -> None:
    response = error_response(pb, exc)
    assert _error(response) == (code, exc.message)


def test_error_response_hides_unexpected_exception_details_but_logs_them() -> None:
    logged: list[str] = []
    response = error_response(pb, KeyError("secret detail"), logged.append)
    code, message = _error(response)
    assert code == pb.TritonError.INTERNAL
    assert message == "internal error (KeyError); see the server log"
    assert "secret detail" not in message
    assert logged == ["internal error: KeyError: 'secret detail'"]


def test_input_array_returns_array_or_names_missing_input() -> None:
    request = _token_request({"A": np.zeros((1, 2))})
    assert input_array(pb, request, "A").shape == (1, 2)
    with pytest.raises(RequestError, match="input B is missing"):
        input_array(pb, request, "B")
