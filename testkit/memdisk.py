"""A data folder in memory (tmpfs) for committees whose members share one process.

Four in-process VerifierNodes share one event loop, and each fsync of any of them (the WAL
before every signature, the signer's state, the block store's per block: ~20 a height for the
four) blocks all four. Beside a busy disk (CI, with the engine tests writing models beside them)
their epochs went from seconds to minutes, and three CI runs failed on waits for epochs. The
tests that check the epoch rules, not the disk, keep those members' data on tmpfs when the
machine has one: every write, fsync, rename and replay runs as before, and an fsync returns at
once. What survives a crash on a real disk is tested on one, by the tests that crash members
(tests/test_faults_verifiers.py, the torn-write consensus schedules), which keep their data on disk.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

TMPFS = Path("/dev/shm")


def tmpfs_root() -> Path | None:
    """The machine's tmpfs, if it has one this process may write to (where fsync costs nothing)."""
    return TMPFS if TMPFS.is_dir() and os.access(TMPFS, os.W_OK) else None


class MemoryFolder:
    """A fresh folder on tmpfs, reachable through the symlink `link` (so a failed test's files
    are found under its own folder); `link` itself as a plain folder where there is no tmpfs.
    `close` removes the tmpfs folder (and a process that dies first leaves only a few MB there)."""

    def __init__(self, link: Path) -> None:
        link = Path(link)
        link.parent.mkdir(parents=True, exist_ok=True)
        self._memory: str | None = None
        root = tmpfs_root()
        if root is not None:
            self._memory = tempfile.mkdtemp(prefix="gt-members-", dir=root)
            link.symlink_to(self._memory, target_is_directory=True)
        else:
            link.mkdir()
        self.path = link

    @property
    def in_memory(self) -> bool:
        return self._memory is not None

    def close(self) -> None:
        if self._memory is not None:
            shutil.rmtree(self._memory, ignore_errors=True)
            self._memory = None
