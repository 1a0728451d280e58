"""The boot counter: sequence numbers of this node's round states that survive restarts and clocks.

Peers accept a validator's signed RoundState only when its sequence number is above the last
one they accepted from it (`Driver._fresh_state`): that is what keeps a replayed old state from
steering their relays. The numbers must therefore grow across restarts of the validator. They
used to start at the wall clock (microseconds) at boot, so a node restarted with its clock
behind its previous boot (an NTP correction, a VM snapshot, a machine without a hardware clock)
was ignored by every peer until the clock caught up: 1 s behind was a million states. With a
quorum that needed that node's relayed votes, the chain halted.

Here a sequence number is the pair (boot, counter) packed into a u64, boot in the high 32 bits:
every start of the node increments a counter kept in its home (`data/boot`, written whole and
synced before the node sends anything), and within one boot the driver counts up from
`boot << 32`. No clock is read. 2^32 round states of one boot (one per gossip period) last
longer than any process; 2^32 boots longer than any machine.

A missing file is boot 1 (a new home). An unreadable one is not a safety matter (a sequence
number signs nothing that could double-sign): the node warns and takes the wall clock in
seconds as its boot number, which is above any count of restarts a real home reaches.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

log = logging.getLogger(__name__)

BOOT_FILE = "boot"
COUNTER_BITS = 32
MAX_BOOT = (1 << 32) - 1


def next_boot(path: Path) -> int:
    """Increment the boot counter at `path` durably and return the new value (>= 1)."""
    path = Path(path)
    previous = _read(path)
    boot = previous + 1
    if boot > MAX_BOOT:
        raise ValueError(f"boot counter {path} is exhausted ({previous}); delete it to start again from 1")
    tmp = path.with_name(path.name + ".new")
    with open(tmp, "w") as f:
        f.write(f"{boot}\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return boot


def first_state_seq(boot: int) -> int:
    """The Driver's `state_seq` for a node in its `boot`-th start: above every number of the
    earlier boots (the driver adds one before each state it signs)."""
    if not 1 <= boot <= MAX_BOOT:
        raise ValueError(f"boot must be in 1..{MAX_BOOT}, not {boot}")
    return boot << COUNTER_BITS


def boot_state_seq(data_dir: Path) -> int:
    """What a node passes as `state_seq` at start: the next boot of its home, as a sequence base."""
    return first_state_seq(next_boot(Path(data_dir) / BOOT_FILE))


def _read(path: Path) -> int:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return 0
    except OSError as exc:
        return _unreadable(path, str(exc))
    try:
        value = int(text.strip())
    except ValueError:
        return _unreadable(path, f"not a number: {text[:20]!r}")
    if not 0 <= value < MAX_BOOT:
        return _unreadable(path, f"{value} is out of range")
    return value


def _unreadable(path: Path, why: str) -> int:
    fallback = min(int(time.time()), MAX_BOOT - 1)
    log.warning("boot counter %s is unreadable (%s): counting on from %d (the clock in seconds); peers may "
                "ignore this node's round states until they restart if its clock is behind", path, why, fallback)
    return fallback
