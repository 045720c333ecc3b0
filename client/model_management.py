"""Runtime model management (load, unload, delete, list) through the ``model_manager`` model."""

from __future__ import annotations

import json
from typing import Any

import numpy as np

MANAGER = "model_manager"


class ModelManagementMixin:
    """Load, unload, delete and list models; mixed into :class:`EmbeddingClient`.

    A load exports the model on the server and can take minutes: these calls use their
    own connection with ``manage_timeout_s`` (default 30 min).
    """

    manage_timeout_s: float = 1800.0

    def manage(self, request: dict[str, Any]) -> dict[str, Any]:
        """Send one JSON request to ``model_manager``; return its JSON answer."""
        data = np.array([json.dumps(request).encode("utf-8")], dtype=np.object_)
        tc = self._tc  # type: ignore[attr-defined]
        infer_input = tc.InferInput("REQUEST", [1], "BYTES")
        infer_input.set_data_from_numpy(data)
        with self._errors(MANAGER):  # type: ignore[attr-defined]
            if self.protocol == "http":  # type: ignore[attr-defined]
                client = tc.InferenceServerClient(
                    self.url,  # type: ignore[attr-defined]
                    connection_timeout=self.manage_timeout_s,
                    network_timeout=self.manage_timeout_s,
                )
                call: dict[str, Any] = {}
            else:
                client = tc.InferenceServerClient(self.url)  # type: ignore[attr-defined]
                call = {"client_timeout": self.manage_timeout_s}
            try:
                result = client.infer(MANAGER, [infer_input], **call, **self._admin)  # type: ignore[attr-defined]
            finally:
                client.close()
        raw = result.as_numpy("RESPONSE").reshape(-1)[0]
        return json.loads(raw.decode("utf-8") if isinstance(raw, bytes) else raw)

    def load_sentence_transformer(
        self, source: str, name: str | None = None, **options: Any
    ) -> dict[str, Any]:
        """Export and load a sentence-transformers model (hub id or server-side folder)."""
        request = {"action": "load", "family": "sentence-transformers", "source": source}
        return self.manage(_with(request, name, options))

    def load_open_clip(
        self,
        arch: str,
        pretrained: str | None = None,
        checkpoint: str | None = None,
        name: str | None = None,
        **options: Any,
    ) -> dict[str, Any]:
        """Export and load an OpenCLIP model by open_clip's names or a local checkpoint."""
        request: dict[str, Any] = {"action": "load", "family": "open-clip", "arch": arch}
        if pretrained:
            request["pretrained"] = pretrained
        if checkpoint:
            request["checkpoint"] = checkpoint
        return self.manage(_with(request, name, options))

    def unload_model(self, name: str) -> dict[str, Any]:
        """Unload a model's ensembles and steps (it is served again after a restart)."""
        return self.manage({"action": "unload", "name": name})

    def delete_model(self, name: str) -> dict[str, Any]:
        """Unload a runtime-loaded model and remove its files and runtime record."""
        return self.manage({"action": "delete", "name": name})

    def managed_models(self) -> list[dict[str, Any]]:
        """Models of the manifest and of runtime loads, with origin and readiness."""
        return self.manage({"action": "list"})["models"]


def _with(request: dict[str, Any], name: str | None, options: dict[str, Any]) -> dict[str, Any]:
    if name:
        request["name"] = name
    if options:
        request["options"] = options
    return request
