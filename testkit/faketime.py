"""A process with a wrong wall clock, through libfaketime (Debian package `faketime`).

libfaketime is preloaded (LD_PRELOAD) into the process and shifts what time(),
gettimeofday() and clock_gettime(CLOCK_REALTIME) return, in C as in Python, including the
clock BoringSSL checks certificate dates with; `DONT_FAKE_MONOTONIC=1` keeps the monotonic
clock real, so timers, timeouts and gRPC deadlines behave. Nothing in the code under test
changes: the skewed node runs exactly the binary every other node runs.

deploy/install_system.sh installs the package; tests skip with `MISSING` as the reason
where the library is absent.
"""

from __future__ import annotations

import glob

#: where Debian/Ubuntu (multiarch) and a source build put the library; the MT variant is
#: the one meant for multi-threaded programs (gRPC runs its own threads)
_CANDIDATES = ("/usr/lib/*/faketime/libfaketimeMT.so.1", "/usr/lib/*/faketime/libfaketime.so.1",
               "/usr/local/lib/faketime/libfaketimeMT.so.1", "/usr/local/lib/faketime/libfaketime.so.1")
MISSING = "libfaketime is not installed (apt-get install faketime; deploy/install_system.sh does it)"


def library() -> str | None:
    """Path of the libfaketime shared library, or None."""
    for pattern in _CANDIDATES:
        found = sorted(glob.glob(pattern))
        if found:
            return found[0]
    return None


def skewed_env(offset_s: int) -> dict[str, str]:
    """Environment for a child process whose wall clock runs `offset_s` seconds off (time
    keeps flowing at the normal rate). Raises RuntimeError if libfaketime is missing."""
    lib = library()
    if lib is None:
        raise RuntimeError(MISSING)
    return {"LD_PRELOAD": lib, "FAKETIME": f"{offset_s:+d}s", "DONT_FAKE_MONOTONIC": "1"}
