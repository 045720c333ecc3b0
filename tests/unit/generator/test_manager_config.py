"""``generator.manager_config``: ``model_manager``'s config parameters, written and read back."""

from __future__ import annotations

from pathlib import Path

import pytest

from embed_runtime.ops.probe import PROBE_INTERVAL_S
from generator.lifecycle import ManagerParams
from generator.manager_config import ManagerConfig

PLACES = {"manifest": "/srv/models.toml", "worker_python": "/usr/bin/python3"}


def test_manager_config_round_trips_through_config_parameters():
    config = ManagerConfig(
        health_probe_interval_s=2.5,
        stub_watch_interval_s=0.0,
        build_timeout_s=60.0,
        **PLACES,
    )
    written = config.to_parameters()
    assert written == {
        **PLACES,
        "build_timeout_s": "60",
        "health_probe_interval_s": "2.5",
        "stub_watch_interval_s": "0",
    }
    assert ManagerConfig.from_parameters(written) == config


def test_manager_config_writes_the_build_timeout_and_probe_interval_at_their_defaults():
    written = ManagerConfig(**PLACES).to_parameters()
    assert written == {**PLACES, "build_timeout_s": "1800", "health_probe_interval_s": "10"}
    read = ManagerConfig.from_parameters(PLACES)
    assert (read.build_timeout_s, read.health_probe_interval_s) == (1800.0, PROBE_INTERVAL_S)
    assert read.stub_watch_interval_s == 1.0


@pytest.mark.parametrize("key", ["manifest", "worker_python"])
def test_manager_config_refuses_a_config_without_a_place(key):
    params = {k: v for k, v in PLACES.items() if k != key}
    with pytest.raises(ValueError, match=f"^model_manager parameter '{key}' is missing$"):
        ManagerConfig.from_parameters(params)


def test_manager_config_refuses_a_build_timeout_that_is_not_a_number():
    with pytest.raises(ValueError, match="could not convert string to float"):
        ManagerConfig.from_parameters({**PLACES, "build_timeout_s": "soon"})


def test_manager_params_read_the_places_from_the_manager_config(tmp_path):
    params = ManagerParams.from_parameters(
        {**PLACES, "build_timeout_s": "90"}, tmp_path, admin_key="k"
    )
    assert params.manifest == Path("/srv/models.toml") and params.repo == tmp_path
    assert (params.worker_python, params.build_timeout_s) == ("/usr/bin/python3", 90.0)
    assert params.admin_key == "k"
