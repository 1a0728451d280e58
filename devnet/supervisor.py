"""Starting and stopping a set of node processes on one machine (the devnet, end-to-end tests).

Every process gets its own session (so a node's engine subprocesses die with it), a log file
in one folder, and a line in a state file. `stop` reads the state file back, so `gt-devnet
down` run from another shell stops exactly what `up` started and nothing else: a pid is only
signalled while its command line still matches what was recorded (pids get reused).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Sequence

STATE_FILE = "processes.json"


@dataclass(frozen=True)
class Managed:
    name: str
    pid: int
    argv: tuple[str, ...]
    log: str


class Supervisor:
    """Owns the processes it spawned under `root`."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.logs = self.root / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self._procs: dict[str, subprocess.Popen] = {}

    def spawn(self, name: str, argv: Sequence[str], env: dict[str, str] | None = None,
              cwd: Path | None = None, via: Sequence[str] = ()) -> Managed:
        """Start `argv` as `name`. `via` is a launcher that execs it (`nsenter --net=... --`:
        the process keeps the launcher's pid, and `argv` as its command line, which is what
        is recorded)."""
        if name in self._procs and self._procs[name].poll() is None:
            raise RuntimeError(f"{name} is already running")
        log_path = self.logs / f"{name}.log"
        log = open(log_path, "ab")
        proc = subprocess.Popen(
            [*via, *argv], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})}, cwd=cwd, start_new_session=True,
        )
        log.close()
        self._procs[name] = proc
        managed = Managed(name, proc.pid, tuple(argv), str(log_path))
        self._record(managed)
        return managed

    def alive(self, name: str) -> bool:
        proc = self._procs.get(name)
        return proc is not None and proc.poll() is None

    def exit_code(self, name: str) -> int | None:
        return self._procs[name].poll()

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Signal one node's whole process group (used by fault-injection tests)."""
        proc = self._procs[name]
        if proc.poll() is None:
            os.killpg(proc.pid, sig)
            if sig in (signal.SIGKILL, signal.SIGTERM):
                proc.wait(timeout=30)

    def stop_all(self, grace_s: float = 15.0) -> None:
        stop_recorded(self.root, grace_s)
        for proc in self._procs.values():
            if proc.poll() is None:
                proc.wait(timeout=5)
        self._procs.clear()

    def _record(self, managed: Managed) -> None:
        state = _read_state(self.root)
        state[managed.name] = asdict(managed)
        (self.root / STATE_FILE).write_text(json.dumps(state, indent=1))


GROUP_GRACE_S = 5.0  # how long a node's other processes get to stop after the node itself is gone
KILL_WAIT_S = 2.0  # how long a SIGKILLed process may take to be gone


def stop_recorded(root: Path, grace_s: float = 15.0) -> list[str]:
    """SIGTERM then SIGKILL every recorded process that is still ours, then every process of
    their groups that outlived them; returns names stopped.

    A node can exit on SIGTERM while a process of its group ignores SIGTERM and stays:
    multiprocessing's resource tracker, which vLLM starts, does (CI saw four of them outlive a
    devnet's `down`). The group's members are listed while the node still leads it (its pid,
    the group's id, cannot have been reused yet) and each is known by its start time."""
    state = _read_state(Path(root))
    live = {name: m for name, m in state.items() if _is_ours(m)}
    members = {pid: start for m in live.values() for pid, start in _group_members(m["pid"]).items()}
    for m in live.values():
        _signal_group(m["pid"], signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(_is_ours(m) for m in live.values()):
        time.sleep(0.2)
    for m in live.values():
        if _is_ours(m):
            _signal_group(m["pid"], signal.SIGKILL)
    _wait_gone(members, GROUP_GRACE_S)
    for pid, start in members.items():
        if _start_time(pid) == start:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
    _wait_gone(members, KILL_WAIT_S)  # SIGKILL lands when the process next runs, not at kill()
    state_path = Path(root) / STATE_FILE
    if state_path.exists():
        state_path.unlink()
    return sorted(live)


def running(root: Path) -> list[str]:
    """Names of the processes recorded under `root` that are still alive (and ours)."""
    return sorted(name for name, m in _read_state(Path(root)).items() if _is_ours(m))


def recorded(root: Path) -> list[str]:
    """Names of every process recorded under `root`, alive or not."""
    return sorted(_read_state(Path(root)))


LINUX_EPHEMERAL = (32768, 60999)  # the kernel's default ip_local_port_range


def ephemeral_ports() -> tuple[int, int]:
    """The ports the kernel hands out on its own (listeners on port 0, outgoing connections)."""
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        return LINUX_EPHEMERAL
    return low, high


def free_port_block(count: int, host: str = "127.0.0.1") -> int:
    """A base port with `count` consecutive free ports on `host` (gt-verifier init numbers
    members from a base port). Free when checked: a race with another process stays possible.
    Drawn below the kernel's ephemeral range where there is room: a port chosen now and bound
    minutes later (a committee that starts after its reference engine) must not be taken in
    between by a listener on port 0 or an outgoing connection (seen: a demo's verifier failed to
    bind). Fixed ports start at 10000."""
    low, high = ephemeral_ports()
    start, stop = 10000, low - count
    if stop - start < 1000:  # a range that leaves no room below it: above it, else anywhere
        start, stop = (high + 1, 65535 - count) if 65535 - count - high > 1000 else (10000, 65535 - count)
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(start, stop)
        socks: list[socket.socket] = []
        try:
            for i in range(count):
                sock = socket.socket()
                socks.append(sock)
                sock.bind((host, base + i))
            return base
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()
    raise RuntimeError(f"no block of {count} free ports on {host}")


def _read_state(root: Path) -> dict:
    path = root / STATE_FILE
    if not path.exists():
        return {}
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError:
        return {}


def _is_ours(m: dict) -> bool:
    """True while pid is alive and still runs the recorded command (not a reused pid)."""
    if _stat_fields(m["pid"]) is None:  # gone, or a zombie: exited, waiting to be reaped
        return False
    try:
        cmdline = Path(f"/proc/{m['pid']}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return [c.decode(errors="replace") for c in cmdline if c] == list(m["argv"])


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/PID/stat after the command name (field 3 on), or None when gone or a zombie."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()
    except OSError:
        return None
    return None if not fields or fields[0] == "Z" else fields


def _start_time(pid: int) -> str | None:
    """When a live process started (clock ticks since boot): tells it from a later one that got its pid."""
    fields = _stat_fields(pid)
    return fields[19] if fields else None


def _wait_gone(members: dict[int, str], timeout_s: float) -> None:
    """Wait until none of `members` (pid: start time) runs any longer, or `timeout_s` passes."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(_start_time(p) == t for p, t in members.items()):
        time.sleep(0.05)


def _group_members(pgid: int) -> dict[int, str]:
    """The live processes of process group `pgid`, by pid, with their start times."""
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (fields := _stat_fields(int(entry))) and fields[2] == str(pgid):
            out[int(entry)] = fields[19]
    return out


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def wait_until(check: Callable[[], bool], timeout_s: float, what: str,
               progress: Callable[[str], None] | None = None, poll_s: float = 0.5,
               status: Callable[[], str] | None = None, usual_s: float | None = None,
               note_every_s: float = 5.0) -> None:
    """Poll `check` until true; raise TimeoutError naming `what`. Every 5 s a progress note
    says how far it is (`status()`, e.g. "2 of 3 engines ready"), for how long, and how long
    it usually takes (`usual_s`, when known)."""
    start = time.monotonic()
    last_note = start
    while True:
        try:
            if check():
                return
        except Exception:  # a node that is still starting may refuse connections
            pass
        now = time.monotonic()
        if now - start > timeout_s:
            raise TimeoutError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        if progress and now - last_note >= note_every_s:
            progress(f"  … still waiting for {what}: {_status(status)}{now - start:.0f}s"
                     f"{f' of ~{usual_s:.0f}s usual' if usual_s else ''}, giving up after {timeout_s:.0f}s")
            last_note = now
        time.sleep(poll_s)


def _status(status: Callable[[], str] | None) -> str:
    if status is None:
        return ""
    try:
        return f"{status()}; "
    except Exception:  # progress must never break the wait
        return ""


def python_module(module: str, *args: str) -> list[str]:
    """argv running `module` with this interpreter (works before console scripts exist)."""
    return [sys.executable, "-m", module, *args]
