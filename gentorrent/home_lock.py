"""One process per node home: an advisory lock on HOME/LOCK, as CometBFT locks its data directory.

Two processes on one home share its keys, its write-ahead log, its block store and its
node.json. A second `gt-verifier start` on a running member's home made both write the same
blocks (the running member halted on `UNIQUE constraint failed: blocks.height`, or lost a torn
tail of its WAL); a second `gt-user start` deleted the first one's node.json on exit. Every
role takes this lock before it touches anything in its home, and before anything heavy loads
(an engine), so the second start stops at once naming the process that holds the home.

The lock is `flock(2)` on an open file: the kernel drops it when the holder dies, however it
dies (kill -9 included), so a crashed node never leaves a stale lock to clean up. The file
holds the holder's PID, for the message only.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

LOCK_FILE = "LOCK"


class HomeInUse(Exception):
    """Another process holds this home."""

    def __init__(self, home: Path, pid: int | None) -> None:
        who = f"process {pid}" if pid else "another process"
        super().__init__(f"{home} is in use by {who} (a node already runs on this home; stop it first, or give "
                         "another --home)")
        self.home, self.pid = home, pid


class HomeLock:
    """The held lock of one home; released by `release()` or when the process exits."""

    def __init__(self, home: Path, fd: int) -> None:
        self.home, self._fd = home, fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the file drops the flock
            self._fd = None


def holder(home: Path) -> int | None:
    """The PID written by the process holding `home` (None if unreadable)."""
    try:
        text = (Path(home) / LOCK_FILE).read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def lock_home(home: Path) -> HomeLock:
    """Take `home` for this process (creating it), or raise HomeInUse naming the holder."""
    home = Path(home)
    home.mkdir(parents=True, exist_ok=True)
    fd = os.open(home / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise HomeInUse(home, holder(home)) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return HomeLock(home, fd)
