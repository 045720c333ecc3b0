"""The Python-backend stubs of a server end with it, whatever they are doing then.

Triton's stub checks every 300 ms that its server still runs; once it does not, it stops
its message threads and exits. That stop first sends every log line the model has
queued (``pb_utils.Logger``), and each line waits, with no timeout, for the server to
acknowledge it; a call that asks the server (``pb_utils.is_model_ready``, ``load_model``)
waits for its answer the same way, holding the GIL, which the stop needs. A line or a
call on its way when the server dies is never answered: the stub then waits forever,
with parent 1, ignoring SIGTERM (its own handler skips SIGTERM and SIGINT) and holding
its memory. Measured on Triton 2.51: a model that logs from a thread, its
``tritonserver`` killed, the stub still there 15 s later, every thread in a futex wait;
``model_manager``'s stub, the server killed while it answered lists and refusals, 4 times of 4.
``model_manager`` logs from its stub-watch and probe threads and for every refused
request, and asks the server; every model logs while it loads.

Nothing inside such a stub can end it: the next thread that logs blocks on the stuck
sender's lock while holding the GIL (measured: a watch thread in the stub, woken by the
server's exit, never ran). So every model here calls :func:`exit_with_server` first in
``initialize``, and the first stub of a server to do so starts one reaper for that
server: this file run by a plain ``python -S`` (12 MiB resident), which waits for the
server to exit (a ``pidfd``, no polling; where the kernel has none, ``/proc`` every
:data:`POLL_S`), then SIGKILLs every stub whose command line names that server, and the
server's process group when it led one, as ``generator serve`` and the tests start it
(the stubs' children too, such as ``model_manager``'s build worker). A Unix socket of
the abstract namespace bound by the reaper (:func:`claim_name`) keeps it one per server,
and goes with it: no file is ever left behind.
"""

from __future__ import annotations

import errno
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

STUB_BINARY = "triton_python_backend_stub"
POLL_S = 0.5  # without pidfd: how often /proc is looked at


def is_stub(exe: str = "/proc/self/exe") -> bool:
    """Whether this process is a Triton Python-backend stub."""
    try:
        return os.path.basename(os.readlink(exe)) == STUB_BINARY
    except OSError:
        return False


def server_of_stub(cmdline: str = "/proc/self/cmdline") -> int:
    """The pid of this stub's server, else of its parent.

    Read from the stub's command line: ``<stub> <model.py> <shm region> <shm size>
    <growth> <server pid> ...``.
    """
    try:
        with open(cmdline, "rb") as handle:
            return int(handle.read().split(b"\0")[5])
    except (OSError, IndexError, ValueError):
        return os.getppid()


def claim_name(server_pid: int) -> str:
    """The abstract socket name the reaper of the server ``server_pid`` holds."""
    return f"\0embed-reaper-{os.getuid()}-{server_pid}"


def claim(server_pid: int) -> socket.socket | None:
    """The bound socket that makes its holder the reaper of ``server_pid``; None if taken."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        sock.bind(claim_name(server_pid))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            return None
        raise
    return sock


def running(pid: int, proc: str = "/proc") -> bool:
    """Whether ``pid`` exists and has not exited (a zombie has)."""
    try:
        with open(os.path.join(proc, str(pid), "stat"), encoding="utf-8") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def wait_exit(pid: int, poll_s: float = POLL_S, proc: str = "/proc") -> None:
    """Return once the process ``pid`` has exited, reaped or not.

    A ``pidfd`` (Linux 5.3+) is readable from then on; where ``pidfd_open`` fails for
    another reason than a process already gone (older kernels, seccomp filters),
    ``/proc`` is read every ``poll_s`` seconds.
    """
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        fd = None
    if fd is None:
        while running(pid, proc):
            time.sleep(poll_s)
        return
    try:
        select.select([fd], [], [])
    finally:
        os.close(fd)


def stub_command_lines(server_pid: int, proc: str = "/proc") -> Iterator[tuple[int, list[bytes]]]:
    """``(pid, command line)`` of each stub process whose command line names ``server_pid``.

    Zombies included: the caller asks :func:`running` when it matters.
    """
    for entry in os.listdir(proc):
        if not entry.isdigit():
            continue
        try:
            with open(os.path.join(proc, entry, "cmdline"), "rb") as handle:
                args = handle.read().split(b"\0")
        except OSError:
            continue
        if len(args) > 5 and args[0].endswith(STUB_BINARY.encode()):
            if args[5] == str(server_pid).encode():
                yield int(entry), args


def server_stubs(server_pid: int, proc: str = "/proc") -> list[int]:
    """Pids of the running stubs whose command line names the server ``server_pid``."""
    return sorted(pid for pid, _ in stub_command_lines(server_pid, proc) if running(pid, proc))


def reap(
    server_pid: int,
    proc: str = "/proc",
    kill: Callable[[int, int], None] = os.kill,
    log: Callable[[str], None] = lambda m: print(m, file=sys.stderr, flush=True),
) -> list[int]:
    """Once the server has exited, SIGKILL its stubs; the pids of those still running.

    The caller then ends the server's process group if the server led it
    (:func:`_main`).
    """
    wait_exit(server_pid, proc=proc)
    stubs = server_stubs(server_pid, proc)
    for pid in stubs:
        try:
            kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if stubs:
        log(
            f"tritonserver (pid {server_pid}) has exited: killed {len(stubs)} of its "
            f"Python-backend stubs still running ({', '.join(map(str, stubs))})"
        )
    return stubs


def start_reaper(server_pid: int, python: str = sys.executable) -> bool:
    """Start the reaper of ``server_pid`` unless one runs; whether one runs."""
    sock = claim(server_pid)
    if sock is None:
        return True  # another stub of this server started it
    from .busy_board import board_dir, board_prefix  # noqa: PLC0415 - not in the reaper

    boards = [board_dir(), board_prefix(server_pid)]
    with sock:  # the reaper holds the name from here on, with its inherited copy
        subprocess.Popen(  # noqa: S603 - this interpreter and this file
            [
                python,
                "-I",
                "-S",
                os.path.abspath(__file__),
                str(server_pid),
                str(sock.fileno()),
                *boards,
            ],
            pass_fds=(sock.fileno(),),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
        )
    return True


def exit_with_server(only_in_stub: bool = True) -> bool:
    """Make sure the reaper of this stub's server runs; whether it does.

    Outside a stub (a unit test calling ``initialize``) nothing starts, unless
    ``only_in_stub`` is False. A failure to start it is written to stderr and the model
    loads all the same.
    """
    if only_in_stub and not is_stub():
        return False
    try:
        return start_reaper(server_of_stub())
    except OSError as exc:
        print(f"server_exit: no reaper for this server: {exc}", file=sys.stderr, flush=True)
        return False


def remove_files(directory: str, prefix: str) -> int:
    """Unlink the files of ``directory`` whose names start with ``prefix``; how many."""
    removed = 0
    for name in os.listdir(directory):
        if name.startswith(prefix):
            try:
                os.unlink(os.path.join(directory, name))
                removed += 1
            except OSError:
                pass
    return removed


def _main(server_pid: int, boards: list[str]) -> None:
    for sig in (signal.SIGINT, signal.SIGHUP):  # a terminal's signals: the server's to take
        signal.signal(sig, signal.SIG_IGN)
    reap(server_pid)
    if len(boards) == 2:  # the server's busy boards (busy_board.py), named by its pid
        remove_files(*boards)
    if os.getpgrp() == server_pid:  # its own group: what the stubs started goes too
        os.killpg(server_pid, signal.SIGKILL)


if __name__ == "__main__":
    # argv[2]: the claim's descriptor, held until the end; argv[3:5]: the boards' place
    _main(int(sys.argv[1]), sys.argv[3:5])
