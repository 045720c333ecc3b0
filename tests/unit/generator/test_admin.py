"""The admin key: the local key file of ``make serve`` (generator side and client side)."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

import client.api
from generator import admin
from generator.admin import AdminKeyError, local_admin_key, local_key_path


def test_local_key_is_created_private_and_then_kept(tmp_path: Path) -> None:
    path = tmp_path / "build" / "admin-key"
    key = local_admin_key(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert admin.configured_admin_key({admin.KEY_ENV: key}) == key  # a valid server key
    assert local_admin_key(path) == key
    assert local_admin_key(tmp_path / "other") != key


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o660, 0o606])
def test_a_key_file_others_can_read_or_write_is_refused(tmp_path: Path, mode: int) -> None:
    path = tmp_path / "admin-key"
    local_admin_key(path)
    path.chmod(mode)
    with pytest.raises(AdminKeyError, match="mode 0600"):
        local_admin_key(path)


def test_a_symlink_is_refused_not_followed(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    local_admin_key(target)
    link = tmp_path / "admin-key"
    link.symlink_to(target)
    with pytest.raises(AdminKeyError):
        local_admin_key(link)


def test_an_empty_key_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "admin-key"
    path.write_text("")
    path.chmod(0o600)
    with pytest.raises(AdminKeyError):
        local_admin_key(path)


def test_generator_and_client_agree_on_where_the_local_key_lives() -> None:
    assert admin.LOCAL_KEY_FILE == client.api.LOCAL_KEY_FILE
    assert admin.LOCAL_KEY_FILE_ENV == client.api.LOCAL_KEY_FILE_ENV
    assert local_key_path({}) == admin.LOCAL_KEY_FILE
    assert local_key_path({admin.LOCAL_KEY_FILE_ENV: "/x/y"}) == Path("/x/y")


@pytest.mark.parametrize(
    ("url", "read"),
    [
        ("127.0.0.1:8000", True),
        ("localhost:8001", True),
        ("[::1]:8000", True),
        ("10.0.0.5:8000", False),
        ("triton.example:8000", False),
        ("127.0.0.1.example:8000", False),
    ],
)
def test_the_client_reads_the_local_key_only_for_this_machine(tmp_path, url, read) -> None:
    path = tmp_path / "admin-key"
    key = local_admin_key(path)
    env = {client.api.LOCAL_KEY_FILE_ENV: str(path)}
    assert client.api.local_admin_key(url, env) == (key if read else None)


def test_the_client_ignores_a_local_key_file_others_can_read(tmp_path: Path) -> None:
    path = tmp_path / "admin-key"
    local_admin_key(path)
    path.chmod(0o644)
    env = {client.api.LOCAL_KEY_FILE_ENV: str(path)}
    assert client.api.local_admin_key("127.0.0.1:8000", env) is None
    missing = {client.api.LOCAL_KEY_FILE_ENV: str(tmp_path / "nope")}
    assert client.api.local_admin_key("127.0.0.1:8000", missing) is None
