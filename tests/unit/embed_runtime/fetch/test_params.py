"""``embed_runtime.fetch.params``: ``fetch_image``'s config parameters, written and read back."""

from __future__ import annotations

import pytest

from embed_runtime.fetch.params import FetchParams
from embed_runtime.fetch.url_fetch import FetchPolicy

CONCURRENCY = {"max_concurrency": "32"}


def test_fetch_params_round_trip_through_config_parameters():
    written = {
        "allow_hosts": "10.0.0.0/8,images.example",
        "connect_timeout_s": "1.5",
        "read_timeout_s": "4.0",
        "max_bytes": "1048576",
        "max_redirects": "0",
        "max_concurrency": "8",
        "allowed_ports": "443,8443",
        "max_batch_bytes": "4194304",
    }
    params = FetchParams.from_parameters(written)
    assert params.to_parameters() == written
    assert params.allow_hosts == ("10.0.0.0/8", "images.example")
    assert (params.allowed_ports, params.max_concurrency) == ((443, 8443), 8)
    assert (params.connect_timeout_s, params.read_timeout_s) == (1.5, 4.0)


def test_fetch_params_write_every_default_and_match_the_policy_defaults():
    written = FetchParams().to_parameters()
    assert written["allow_hosts"] == "" and written["allowed_ports"] == ""
    assert written["max_concurrency"] == "32"
    assert FetchParams.from_parameters(written).policy() == FetchPolicy()


def test_fetch_params_refuse_a_config_without_max_concurrency():
    with pytest.raises(ValueError, match="fetch_image config parameter 'max_concurrency' is"):
        FetchParams.from_parameters({})


def test_from_parameters_parses_all_keys():
    policy = FetchParams.from_parameters(
        {
            "allow_hosts": " 127.0.0.1, 10.0.0.0/8 ,images.example,",
            "connect_timeout_s": "1.5",
            "read_timeout_s": "4",
            "max_bytes": "1048576",
            "max_redirects": "0",
            "allowed_ports": " 443, 8443,",
            "max_batch_bytes": "4194304",
            "unrelated": "ignored",
            **CONCURRENCY,
        }
    ).policy()
    assert policy.allow_hosts == ("127.0.0.1", "10.0.0.0/8", "images.example")
    assert (policy.allowed_ports, policy.max_batch_bytes) == ((443, 8443), 4194304)
    assert (policy.connect_timeout_s, policy.read_timeout_s) == (1.5, 4.0)
    assert (policy.max_bytes, policy.max_redirects) == (1048576, 0)


def test_from_parameters_keeps_defaults_for_absent_keys():
    def policy(**params: str) -> FetchPolicy:
        return FetchParams.from_parameters({**params, **CONCURRENCY}).policy()

    assert policy() == FetchPolicy()
    assert policy(allow_hosts="").allow_hosts == ()
    assert policy(allowed_ports="").allowed_ports == ()


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("connect_timeout_s", "abc"),
        ("connect_timeout_s", "0"),
        ("read_timeout_s", "-1"),
        ("read_timeout_s", "nan"),
        ("read_timeout_s", "inf"),
        ("max_bytes", "1.5"),
        ("max_bytes", "0"),
        ("max_redirects", "-1"),
        ("max_redirects", ""),
        ("allow_hosts", "10.0.0.0/33"),
        ("allowed_ports", "80,http"),
        ("allowed_ports", "0"),
        ("allowed_ports", "65536"),
        ("allowed_ports", "-1"),
        ("max_batch_bytes", "0"),
        ("max_batch_bytes", "1e9"),
    ],
)
def test_from_parameters_rejects_bad_value(key, value):
    with pytest.raises(ValueError, match=key):
        FetchParams.from_parameters({key: value, **CONCURRENCY})


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("max_bytes", "1.5", "config parameter max_bytes='1.5' is not a valid int"),
        ("allowed_ports", "80,http", "allowed_ports='80,http' is not a comma-separated list"),
        ("max_redirects", "-1", "bad fetch config parameter: max_redirects must be >= 0"),
    ],
)
def test_fetch_params_refusals_keep_their_messages(key, value, message):
    with pytest.raises(ValueError, match=message):
        FetchParams.from_parameters({key: value, **CONCURRENCY})
