"""The body of every ``<name>_tokenize`` model: one tokenizer, built once, one call per execution.

Each tokenize adapter (``embed_runtime/models/tokenize*.py``) is a :class:`TokenizeStep`
that says how its tokenizer is opened and how a request's rows are read. ``pb_utils`` is
the adapter's, never imported here.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, ClassVar

from ..ops.integrity import verify_digests
from ..ops.server_exit import exit_with_server
from ..text.tokenizer import TokenizerParams
from .adapter import config_parameters, tokenize_requests
from .admission import AdmissionGate


class TokenizeStep:
    """A Triton Python model that tokenizes rows; subclasses name ``pb_utils``.

    They also implement ``open_tokenizer``, ``_read`` (a request's rows) and ``_encode``
    (all valid rows of an execution at once).
    """

    pb_utils: ClassVar[Any]

    def open_tokenizer(self, path: str, params: Mapping[str, str]) -> Any:
        """The tokenizer of the file ``path``; ``params`` are the model's config parameters."""
        raise NotImplementedError

    def _read(self, request: Any) -> list:
        raise NotImplementedError

    def _encode(self, rows: list) -> dict:
        raise NotImplementedError

    def initialize(self, args: Mapping[str, str]) -> None:
        """Build the tokenizer once from the model's config parameters."""
        exit_with_server()
        self.logger = self.pb_utils.Logger
        params = config_parameters(args["model_config"])
        self.params = TokenizerParams.from_parameters(params)
        model_dir = os.path.join(args["model_repository"], args["model_version"])
        verify_digests(model_dir)  # a corrupt tokenizer file fails the load
        path = os.path.join(model_dir, params["tokenizer_file"])
        self.tokenizer = self.open_tokenizer(path, params)
        self.gate = AdmissionGate.from_parameters(
            params, args["model_version"], self.pb_utils, args["model_name"],
            max_tokens=self.params.max_length,
        )

    def execute(self, requests: list) -> list:
        """Admit, validate every request, tokenize all valid rows at once, slice back."""
        names, log = self.params.output_names, self.logger.log_error
        return tokenize_requests(
            self.pb_utils, requests, self._read, self._encode, names, log, self.gate
        )

    def finalize(self) -> None:
        """Drop the tokenizer and free this instance's admission slot."""
        self.tokenizer = None
        if self.gate is not None:
            self.gate.close()
