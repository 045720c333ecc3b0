"""The options of ``bench.faults.overload``: loads, factors, queues, rates, cores.

Pure parsing (no server), so every option is unit-tested.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

from bench.faults.overload_loads import LOADS

# Below, at and a few times above the rows per execution at saturation (3-6 measured
# here), one far above, and one with a queue timeout.
DEFAULT_QUEUES = ("1", "4", "16", "0", "4:10000")
DEFAULT_FACTORS = "1,2,3"
AUTO_PIN_CORES = 4
CLIPS = ("tiny", "vit-b-32")


def parse_queue(value: str) -> dict[str, int] | None:
    """``N`` or ``N:T``: Triton's queue policy, ``max_queue_size`` N, ``queue_timeout_us`` T.

    ``none``: no configuration beside the default (``None``).

    The steps' own admission (``admission_wait_us``) is off in these configurations: the
    steps in front of the encoders drop Triton's policy where they admit.
    """
    if value == "none":
        return None
    size, _, timeout = value.partition(":")
    return {
        "max_queue_size": int(size),
        "queue_timeout_us": int(timeout or 0),
        "admission_wait_us": 0,
        "admission_max_rows": 0,
    }


def config_name(knobs: dict[str, int]) -> str:
    """``default``, ``unbounded``, ``queue-8`` or ``queue-8-timeout-20000us``."""
    if not knobs:
        return "default"
    name = f"queue-{knobs['max_queue_size']}" if knobs["max_queue_size"] else "unbounded"
    return name + (f"-timeout-{knobs['queue_timeout_us']}us" if knobs["queue_timeout_us"] else "")


def parse_loads(value: str) -> list[str]:
    """``text1,images`` -> the loads in :data:`LOADS` order; an unknown name exits."""
    names = {n.strip() for n in value.split(",") if n.strip()}
    if not names or names - set(LOADS):
        raise SystemExit(
            f"--load {value!r}: expected a comma-separated subset of {','.join(LOADS)}"
        )
    return [n for n in LOADS if n in names]


def parse_rates(value: str | None) -> dict[str, float]:
    """``text1=200,images=12.5`` -> the sustainable rates to use instead of measuring."""
    rates = {}
    for pair in (value or "").split(","):
        name, sep, rate = pair.partition("=")
        if not pair.strip():
            continue
        if not sep or name.strip() not in LOADS:
            raise SystemExit(f"--rate {value!r}: expected LOAD=REQ_PER_S,... of {LOADS}")
        rates[name.strip()] = float(rate)
    return rates


def parse_args(argv: Sequence[str] | None, description: str | None = None) -> argparse.Namespace:
    """Command-line options; ``description`` heads the help (the benchmark's docstring)."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.faults.overload",
        description=description,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = parser.add_argument
    add("--quick", action="store_true", help="4 s loads, short closed loops, no 10 %% run")
    add("--load", default=",".join(LOADS), type=parse_loads,
        help=f"loads, comma-separated (default {','.join(LOADS)})")
    add("--seconds", type=float, help="each loaded run (default 30, quick 4)")
    add("--reference-s", type=float, help="the 0.8 x run (default 20, quick 4)")
    add("--unloaded-s", type=float, help="the 10 %% run, 0 to skip (default 10, quick 0)")
    add("--factor", default=DEFAULT_FACTORS,
        help="load / sustainable rate, comma-separated (default 1,2,3)")
    add("--clip", choices=CLIPS, default="tiny",
        help="the CLIP model of the images load (default tiny)")
    add("--send-deadline", action=argparse.BooleanOptionalAction, default=True,
        help="send the deadline as the request parameter deadline_unix_us too")
    add("--pin", default="auto", help="auto, none, or SERVER_CPUS/CLIENT_CPUS like 0-2/3")
    add("--generator-nice", type=int, default=0,
        help="the load generator's nice value during the open loops (negative: ahead of "
        "the server, as a client on its own machine is; default 0)")
    add("--rate", type=parse_rates, default={}, metavar="LOAD=REQ_PER_S,...",
        help="use these sustainable rates, skip measuring them")
    add("--queue", action="append", type=parse_queue, metavar="N[:TIMEOUT_US]",
        help="a configuration beside the default (repeatable; 0: unbounded; none: the "
        "default alone; default 1, 4, 16, 0, 4:10000)")
    add("--set", action="append", default=[], metavar="KEY=VALUE",
        help="a serving knob of the text model in every configuration")
    add("--clients", default="8,16,32", help="closed-loop concurrencies")
    add("--deadline-s", type=float, default=5.0, help="client deadline")
    add("--senders", type=int, default=2, help="open-loop sender threads")
    add("--pool", type=int, default=512, help="distinct sentences")
    args = parser.parse_args(argv)
    quick = args.quick
    args.seconds = args.seconds or (4.0 if quick else 30.0)
    args.reference_s = args.reference_s or (4.0 if quick else 20.0)
    args.unloaded_s = args.unloaded_s if args.unloaded_s is not None else (0.0 if quick else 10.0)
    args.queue = args.queue or [parse_queue(q) for q in DEFAULT_QUEUES]
    args.queue = [q for q in args.queue if q is not None]
    args.clients = [int(c) for c in args.clients.split(",")]
    args.factor = [float(f) for f in str(args.factor).split(",")]
    args.pin = cpu_split(args.pin, sorted(os.sched_getaffinity(0)))
    return args


def _cpus(text: str) -> list[int]:
    """``0-2,5`` -> ``[0, 1, 2, 5]``."""
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out += range(int(lo), int(hi or lo) + 1)
    return out


def cpu_split(spec: str, cpus: list[int]) -> dict[str, list[int]] | None:
    """The server's and the load generator's cores for ``--pin`` (``None``: not pinned).

    ``auto`` gives the generator the last quarter of ``cpus`` and the server the rest,
    from 4 cores up; under that the server needs every core, so ``auto`` pins nothing.
    """
    if spec == "none" or (spec == "auto" and len(cpus) < AUTO_PIN_CORES):
        return None
    if spec == "auto":
        client = max(1, len(cpus) // 4)
        return {"server": cpus[:-client], "load_generator": cpus[-client:]}
    server, sep, client = spec.partition("/")
    split = {"server": _cpus(server), "load_generator": _cpus(client)} if sep else None
    if not split or set(split["server"]) & set(split["load_generator"]):
        raise SystemExit(f"--pin {spec!r}: expected auto, none or SERVER/CLIENT, disjoint")
    return split
