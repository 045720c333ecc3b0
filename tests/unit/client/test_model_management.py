"""Requests the client sends to ``model_manager`` (``client.model_management``)."""

from __future__ import annotations

from typing import Any

from client.model_management import ModelManagementMixin


class _Recorder(ModelManagementMixin):
    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    def manage(self, request: dict[str, Any]) -> dict[str, Any]:
        self.sent.append(request)
        return {"models": [{"name": "m"}]}


def test_loads_name_the_family_and_carry_name_and_options_only_when_given() -> None:
    client = _Recorder()
    client.load_sentence_transformer("org/mini")
    client.load_sentence_transformer("org/mini", name="mini", max_batch_size=8)
    client.load_open_clip("ViT-B-32", pretrained="laion", name="clip")
    client.load_open_clip("RN50", checkpoint="/w.pt")
    assert client.sent == [
        {"action": "load", "family": "sentence-transformers", "source": "org/mini"},
        {
            "action": "load",
            "family": "sentence-transformers",
            "source": "org/mini",
            "name": "mini",
            "options": {"max_batch_size": 8},
        },
        {
            "action": "load",
            "family": "open-clip",
            "arch": "ViT-B-32",
            "pretrained": "laion",
            "name": "clip",
        },
        {"action": "load", "family": "open-clip", "arch": "RN50", "checkpoint": "/w.pt"},
    ]


def test_unload_delete_and_list_send_their_action() -> None:
    client = _Recorder()
    client.unload_model("a")
    client.delete_model("b")
    assert client.managed_models() == [{"name": "m"}]
    assert client.sent == [
        {"action": "unload", "name": "a"},
        {"action": "delete", "name": "b"},
        {"action": "list"},
    ]
