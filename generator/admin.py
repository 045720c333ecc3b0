"""The admin key: who may change what the server runs.

Triton's model-repository API loads a model whose ``model.py`` travels in the request,
so whoever reaches it runs code as the server's user. Every start therefore restricts
the admin APIs of HTTP and gRPC to requests carrying ``X-Admin-Key``, and the
``model_manager`` model checks the same header (forwarded by Triton as a request
parameter). The key comes from ``EMBED_ADMIN_KEY`` or from the file named by
``EMBED_ADMIN_KEY_FILE`` (Docker / Kubernetes secrets). Without one, the restricted
APIs get an unguessable per-start key nobody is told, and ``model_manager`` refuses
every action.
"""

from __future__ import annotations

import hmac
import os
import secrets
import stat
from collections.abc import Mapping
from pathlib import Path

ADMIN_HEADER = "X-Admin-Key"
KEY_ENV = "EMBED_ADMIN_KEY"
KEY_FILE_ENV = "EMBED_ADMIN_KEY_FILE"
GRPC_PREFIX = "triton-grpc-protocol-"
MIN_KEY_LENGTH = 16
# Triton API groups that need the key. health, metadata, inference and statistics stay
# open: statistics carries the same counters the metrics port publishes (docs/security.md).
RESTRICTED_APIS = ("model-repository", "model-config", "logging", "trace", "shared-memory")


class AdminKeyError(ValueError):
    """The configured admin key is unusable (empty, too short, unreadable file)."""


def configured_admin_key(env: Mapping[str, str] | None = None) -> str | None:
    """The operator's key from ``EMBED_ADMIN_KEY`` or ``EMBED_ADMIN_KEY_FILE``; None if unset.

    A file's trailing newline is dropped. Setting both, an empty or short key, or a
    missing file is an error: a typo must not silently leave the server keyless.
    """
    env = os.environ if env is None else env
    value, path = env.get(KEY_ENV), env.get(KEY_FILE_ENV)
    if value and path:
        raise AdminKeyError(f"set either {KEY_ENV} or {KEY_FILE_ENV}, not both")
    if path:
        try:
            value = Path(path).read_text(encoding="utf-8").rstrip("\r\n")
        except OSError as exc:
            raise AdminKeyError(f"{KEY_FILE_ENV}={path} cannot be read ({exc.strerror})") from None
        where = KEY_FILE_ENV
    else:
        where = KEY_ENV
    if value is None or (not value and not path):
        return None
    if len(value) < MIN_KEY_LENGTH or value != value.strip():
        raise AdminKeyError(
            f"the key from {where} must be at least {MIN_KEY_LENGTH} characters with no "
            "surrounding whitespace (e.g. python3 -c 'import secrets; "
            "print(secrets.token_urlsafe(32))')"
        )
    if not value.isprintable() or any(c in value for c in ",:="):
        raise AdminKeyError(f"the key from {where} must be printable and hold no ',', ':' or '='")
    return value


# `make serve` without a key: one made for this checkout, readable by its owner only, that
# the client, its CLI and `make perf` on the same machine find by themselves. Containers
# never use it (the entrypoint does not pass --local-admin-key): they need an explicit key.
LOCAL_KEY_FILE_ENV = "EMBED_LOCAL_ADMIN_KEY_FILE"
LOCAL_KEY_FILE = Path(__file__).resolve().parents[1] / ".build" / "admin-key"


def local_key_path(env: Mapping[str, str] | None = None) -> Path:
    """Where the local key lives: ``$EMBED_LOCAL_ADMIN_KEY_FILE``, else ``.build/admin-key``."""
    env = os.environ if env is None else env
    return Path(env.get(LOCAL_KEY_FILE_ENV) or LOCAL_KEY_FILE)


def local_admin_key(path: Path) -> str:
    """The key in ``path``, created (mode 0600) with a random key if it is not there.

    An existing file must be a regular file of this user that no one else can read or
    write (anything else could plant or read the key): otherwise :class:`AdminKeyError`.
    """
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        info = os.lstat(path)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
            raise AdminKeyError(
                f"{path} must be a regular file of uid {os.getuid()} with mode 0600 (it holds "
                "the local admin key); remove it to get a new one"
            ) from None
        key = configured_admin_key({KEY_FILE_ENV: str(path)})
        if key is None:
            raise AdminKeyError(f"{path} is empty; remove it to get a new key") from None
        return key
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        return local_admin_key(path)
    key = secrets.token_urlsafe(32)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(key + "\n")
    return key


def server_admin_key(env: Mapping[str, str] | None = None) -> str:
    """The key the server's restricted APIs check: the configured one or a random one."""
    return configured_admin_key(env) or secrets.token_urlsafe(32)


def restriction_args(key: str) -> list[str]:
    """``tritonserver`` flags restricting the admin APIs to ``key`` and forwarding the header.

    gRPC metadata keys are lower case, so the gRPC restriction names the header so; Triton
    then expects it as ``triton-grpc-protocol-x-admin-key`` (see :func:`request_headers`).
    """
    apis = ",".join(RESTRICTED_APIS)
    header = ADMIN_HEADER.lower()
    return [
        f"--http-restricted-api={apis}:{ADMIN_HEADER}={key}",
        f"--grpc-restricted-protocol={apis}:{header}={key}",
        f"--http-header-forward-pattern=(?i)^{header}$",
        f"--grpc-header-forward-pattern=(?i)^(triton-grpc-protocol-)?{header}$",
    ]


def key_matches(given: object, expected: str) -> bool:
    """Constant-time comparison of a presented key with the expected one."""
    if not isinstance(given, str) or not given:
        return False
    return hmac.compare_digest(given.encode("utf-8"), expected.encode("utf-8"))


def presented_keys(parameters: Mapping[str, object]) -> list[object]:
    """The admin keys a request carries: Triton forwards the header as a request parameter.

    gRPC clients send ``x-admin-key`` (forwarded) and ``triton-grpc-protocol-x-admin-key``
    (what Triton's gRPC restriction reads); either is accepted.
    """
    names = {ADMIN_HEADER.lower(), GRPC_PREFIX + ADMIN_HEADER.lower()}
    return [value for name, value in parameters.items() if name.lower() in names]


def request_headers(key: str, protocol: str) -> dict[str, str]:
    """Headers that present ``key`` to the restricted APIs and to ``model_manager``."""
    if protocol == "grpc":
        header = ADMIN_HEADER.lower()
        return {header: key, GRPC_PREFIX + header: key}
    return {ADMIN_HEADER: key}
