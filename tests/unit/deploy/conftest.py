"""Fixtures shared by the Docker deployment tests."""

from __future__ import annotations

import pytest
import yaml

from tests.unit.deploy.deploy_files import COMPOSE


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())
