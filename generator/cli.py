"""Command line: build the repository, add/remove a model, list, serve, stop.

python -m generator build                 # every entry of models.toml (skips unchanged)
python -m generator add NAME --family sentence-transformers --source ID_OR_DIR
python -m generator defaults     # the serving profile a bare entry gets on each device
python -m generator remove NAME
python -m generator list
python -m generator serve                 # build, run tritonserver (foreground; SIGTERM drains)
python -m generator gateway-config F   # the OpenAI gateway's config (docs/clients.md)
python -m generator stop
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path

from embed_runtime.ops.stub_watch import health_path

from .admin import (
    ADMIN_HEADER,
    KEY_ENV,
    KEY_FILE_ENV,
    configured_admin_key,
    local_admin_key,
    local_key_path,
)
from .build import RepositoryWriter, build_repository, entry_fingerprint, remove_entry
from .families import FAMILIES
from .manifest import DEVICES, ManifestError, load_serving_manifest
from .manifest_edit import append_entry, remove_entry_text, restored_on_error
from .profiles import describe as profiles_text
from .profiles import profile_defaults
from .shared_models import startup_models
from .supervisor import DrainSettings, Supervisor, max_restarts, start_stall_s
from .tracing import ENDPOINT_ENV, EXPORT_DELAY_ENV, RATE_ENV, RESOURCE_ENV, TraceSettings
from .triton_local import (
    TritonLaunch,
    TritonPorts,
    launch_env,
    listen_host,
    local_http_url,
    prepare_backends,
    server_command,
    stop_pid,
)

DEFAULT_MANIFEST = Path(os.environ.get("EMBED_MANIFEST", "models.toml"))
DEFAULT_REPO = Path(os.environ.get("EMBED_MODEL_REPOSITORY", "model_repository"))
DEFAULT_PID = Path(os.environ.get("EMBED_PID_FILE", ".build/tritonserver.pid"))


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m generator", description=__doc__.split("\n")[0])
    parser.add_argument("--manifest", type=Path, default=DEFAULT_MANIFEST)
    parser.add_argument("--repo", type=Path, default=DEFAULT_REPO)
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser("build", help="build the repository from the manifest")
    build.add_argument("--only", action="append", help="build only this entry (repeatable)")
    build.add_argument("--force", action="store_true", help="rebuild even if unchanged")
    add = sub.add_parser("add", help="append a model to the manifest and build it")
    add.add_argument("name")
    add.add_argument(
        "--family", required=True, choices=list(FAMILIES)
    )
    add.add_argument("--source", help="HF id or local folder (sentence-transformers)")
    add.add_argument("--arch", help="open_clip architecture, e.g. ViT-B-32")
    add.add_argument("--pretrained", help="open_clip pretrained tag")
    add.add_argument("--checkpoint", help="local open_clip checkpoint file")
    add.add_argument("--max-batch-size", type=int)
    add.add_argument(
        "--device",
        choices=DEVICES,
        help="where the encoder runs (default cpu); the entry takes that device's profile",
    )
    sub.add_parser("defaults", help="print the per-device serving profiles of bare entries")
    remove = sub.add_parser("remove", help="remove a model from the manifest and repository")
    remove.add_argument("name")
    sub.add_parser("list", help="print what is served")
    tiny = sub.add_parser("tiny-clip", help="save a tiny random-init OpenCLIP checkpoint")
    tiny.add_argument("out_dir", type=Path)
    tiny.add_argument("--seed", type=int, default=0)
    rerank = sub.add_parser("tiny-rerank", help="save a tiny random-init cross-encoder")
    rerank.add_argument("out_dir", type=Path)
    rerank.add_argument("--seed", type=int, default=0)
    random_text = sub.add_parser(
        "random-text", help="save a random-init sentence-transformers model of a real size"
    )
    random_text.add_argument("out_dir", type=Path)
    random_text.add_argument("--shape", default="e5-small", help="e5-small, e5-base, minilm-l6")
    random_text.add_argument("--tokenizer", type=Path, help="tokenizer folder (default: MiniLM)")
    random_text.add_argument("--seed", type=int, default=0)
    serve = sub.add_parser("serve", help="build, then run tritonserver in the foreground")
    serve.add_argument("--no-build", action="store_true")
    serve.add_argument("--pid-file", type=Path, default=DEFAULT_PID)
    serve.add_argument("--work-dir", type=Path, default=Path(".build"))
    serve.add_argument(
        "--local-admin-key",
        action="store_true",
        help="without EMBED_ADMIN_KEY(_FILE): use (or create, mode 0600) the local key file "
        "that clients on this machine read by default (make serve; never in containers)",
    )
    serve.add_argument(
        "--trace-endpoint",
        metavar="URL",
        help="export OpenTelemetry spans over OTLP/HTTP to URL, e.g. "
        f"http://localhost:4318/v1/traces (default ${ENDPOINT_ENV}; unset: no tracing)",
    )
    serve.add_argument(
        "--trace-rate",
        type=int,
        metavar="N",
        help=f"trace 1 request in N (default ${RATE_ENV}, else 1000); 0: only requests "
        "with a traceparent, which are traced at any rate",
    )
    serve.add_argument(
        "--trace-resource",
        action="append",
        metavar="KEY=VALUE",
        help=f"a resource attribute of every span (repeatable; default ${RESOURCE_ENV}, "
        "comma-separated)",
    )
    serve.add_argument(
        "--trace-export-delay-ms",
        type=int,
        metavar="MS",
        help=f"export spans at least this often (default ${EXPORT_DELAY_ENV}, else 5000)",
    )
    gateway = sub.add_parser(
        "gateway-config", help="write the OpenAI gateway's config"
    )
    gateway.add_argument("out", type=Path, help="the YAML file to write")
    stop = sub.add_parser("stop", help="stop the server started by serve")
    stop.add_argument("--pid-file", type=Path, default=DEFAULT_PID)
    return parser


def _cmd_build(args) -> int:
    manifest = load_serving_manifest(args.manifest, args.repo)
    report = build_repository(manifest, args.repo, only=args.only, force=args.force)
    for name in report.built:
        print(f"built   {name} ({report.seconds.get(name, 0)} s)")
    for name in report.skipped:
        print(f"current {name}")
    for name in report.removed:
        print(f"removed {name}")
    return 0


def _cmd_add(args) -> int:
    fields = {
        "name": args.name,
        "family": args.family,
        "source": args.source,
        "arch": args.arch,
        "pretrained": args.pretrained,
        "checkpoint": args.checkpoint,
        "max_batch_size": args.max_batch_size,
        "device": args.device,
    }
    with restored_on_error(args.manifest):
        append_entry(args.manifest, {k: v for k, v in fields.items() if v is not None})
        manifest = load_serving_manifest(args.manifest, args.repo)
        build_repository(manifest, args.repo, only=[args.name])
    entry = manifest.get(args.name)
    print(f"added {args.name}: serves {', '.join(entry.ensembles)}")
    taken = profile_defaults(entry.device, entry.family, entry.encoder_backend)
    given = {k: v for k, v in fields.items() if v is not None}
    settings = ", ".join(f"{k} = {getattr(entry, k)!r}" for k in taken if k not in given)
    print(f"  {entry.device} profile (python -m generator defaults): {settings}")
    return 0


def _cmd_defaults(_args) -> int:
    print(profiles_text())
    return 0


def _cmd_remove(args) -> int:
    remove_entry_text(args.manifest, args.name)
    dirs = remove_entry(args.repo, args.name)
    print(f"removed {args.name} ({', '.join(dirs) or 'nothing built'})")
    return 0


def _cmd_list(args) -> int:
    manifest = load_serving_manifest(args.manifest, args.repo)
    state = RepositoryWriter(args.repo).load_state()
    writer = RepositoryWriter(args.repo)
    for entry in manifest.models:
        current = writer.is_current(entry.name, entry_fingerprint(entry, manifest), state)
        status = "built" if current else "not built"
        print(f"{entry.name:32} {entry.family:22} {status:10} {' '.join(entry.ensembles)}")
    return 0


def _write_fixture(
    name: Path, markers: tuple[Path, ...], create: Callable[[], object], detail: str = ""
) -> int:
    """Create the fixture model ``name`` unless its ``markers`` exist (then say so)."""
    if all(marker.is_file() for marker in markers):
        print(f"{name} exists")
        return 0
    create()
    print(f"wrote {name}{detail}")
    return 0


def _cmd_tiny_clip(args) -> int:
    from .fixtures.tiny_clip import TINY_ARCH, create_tiny_checkpoint  # noqa: PLC0415

    checkpoint = args.out_dir / "open_clip_pytorch_model.bin"
    arch = args.out_dir / f"{TINY_ARCH}.json"
    create = partial(create_tiny_checkpoint, checkpoint, seed=args.seed)
    return _write_fixture(checkpoint, (checkpoint, arch), create, f" and {arch}")


def _cmd_tiny_rerank(args) -> int:
    from .fixtures.tiny_rerank import create_tiny_cross_encoder  # noqa: PLC0415

    create = partial(create_tiny_cross_encoder, args.out_dir, seed=args.seed)
    return _write_fixture(args.out_dir, (args.out_dir / "modules.json",), create)


def _cmd_random_text(args) -> int:
    from .fixtures.random_text import create_random_text_model  # noqa: PLC0415

    create = partial(create_random_text_model, args.out_dir, args.shape, args.tokenizer, args.seed)
    detail = f" ({args.shape}, random weights)"
    return _write_fixture(args.out_dir, (args.out_dir / "modules.json",), create, detail)


def _cmd_serve(args) -> int:
    drain = DrainSettings.from_env()  # a typo in these settings fails before the build
    restarts = max_restarts()
    stall_s = start_stall_s()
    trace = TraceSettings.resolve(
        args.trace_endpoint, args.trace_rate, args.trace_resource, args.trace_export_delay_ms
    )
    manifest = load_serving_manifest(args.manifest, args.repo)
    if not args.no_build:
        build_repository(manifest, args.repo)
    names = startup_models(manifest)
    key = configured_admin_key()
    local_key = None
    if key is None and args.local_admin_key:
        local_key = local_key_path()
        key = local_admin_key(local_key)
        os.environ[KEY_FILE_ENV] = str(local_key)  # model_manager's operator key, as given
    launch = TritonLaunch(
        args.repo.resolve(),
        TritonPorts.from_env(),
        load_models=names,
        host=listen_host(),
        admin_key=key or "",
        trace=trace,
    )
    backends = prepare_backends(args.work_dir.resolve() / "backends")
    cmd = server_command(launch, backends)
    args.pid_file.parent.mkdir(parents=True, exist_ok=True)
    args.pid_file.write_text(str(os.getpid()))
    if local_key is not None:
        admin = (
            f"need the {ADMIN_HEADER} header: the local key in {local_key} (mode 0600), which "
            "the client, its CLI and make perf on this machine read by themselves"
        )
    elif key:
        admin = f"need the {ADMIN_HEADER} header ({KEY_ENV})"
    else:
        admin = f"locked (no {KEY_ENV}: model_manager refuses every action)"
    print(
        f"starting tritonserver on {launch.host}: HTTP {launch.ports.http}, "
        f"gRPC {launch.ports.grpc}, metrics {launch.ports.metrics}; admin APIs {admin}; "
        f"traces: {trace.describe() if trace else 'off'}; models: {', '.join(names)}",
        flush=True,
    )
    supervisor = Supervisor(
        cmd, launch_env(launch), local_http_url(launch), launch.admin_key,
        health_path(launch.ports.http), drain, restarts=restarts, shm_prefix=launch.shm_prefix,
        stall_s=stall_s,
    )
    return supervisor.run()


def _cmd_gateway_config(args) -> int:
    from .gateway import write_gateway_config  # noqa: PLC0415

    routes = write_gateway_config(load_serving_manifest(args.manifest, args.repo), args.out)
    print(f"wrote {args.out}: /v1/embeddings for {', '.join(routes) or 'no text model'}")
    return 0


def _cmd_stop(args) -> int:
    if not args.pid_file.is_file():
        print("no server recorded")
        return 0
    pid = int(args.pid_file.read_text())
    print("stopped" if stop_pid(pid) else "not running")
    args.pid_file.unlink(missing_ok=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m generator``."""
    args = _parser().parse_args(argv)
    commands = {
        "build": _cmd_build,
        "add": _cmd_add,
        "remove": _cmd_remove,
        "list": _cmd_list,
        "defaults": _cmd_defaults,
        "tiny-clip": _cmd_tiny_clip,
        "tiny-rerank": _cmd_tiny_rerank,
        "random-text": _cmd_random_text,
        "serve": _cmd_serve,
        "gateway-config": _cmd_gateway_config,
        "stop": _cmd_stop,
    }
    try:
        return commands[args.command](args)
    except (ManifestError, FileNotFoundError, KeyError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:
        print(
            f"error: {exc}: building a model needs the generator's dependencies "
            "(pip install -e '.[generator]'; in Docker, the 'generator' image target)",
            file=sys.stderr,
        )
        return 2
