"""Failpoints: crash a process at one exact line, on the N-th time it gets there.

The technique of etcd's gofail and TiKV's fail-rs. Random kill -9 rarely lands in the few
microseconds between two durable writes (a block saved but not executed, a vote signed but
not yet in the write-ahead log), yet those are exactly the moments where a crash-recovery
bug loses a transaction or signs twice. A failpoint names such a moment; a test arms it
through the environment of the process it starts:

    GT_FAILPOINTS="verifier.after_finalize=kill@3"             # SIGKILL itself on the 3rd hit
    GT_FAILPOINTS="verifier.before_sign=exit;verifier.after_commit=kill@2"

Actions: `kill` sends SIGKILL to the process itself (exactly what kill -9 does: no handler,
no finally, no flush; the parent sees -9), `exit` calls os._exit(137) (no cleanup either,
for platforms or sandboxes where a self-SIGKILL is unwanted), `raise` raises FailpointError
there (a failure the process must handle: a member whose application fails halts). `@N` fires on the N-th hit
(default 1); earlier hits pass. Before dying the process writes one line to stderr,
"failpoint <name> fired (<action> on hit N)", so a test can tell the crash it asked for from
any other death.

When GT_FAILPOINTS is unset, `hit(name)` is one dictionary-truthiness test: production code
keeps its call sites at no cost. Only names declared in POINTS may be armed, so a typo in a
test's spec is an error at start, not a failpoint that silently never fires.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass

ENV_VAR = "GT_FAILPOINTS"
EXIT_CODE = 137  # what a shell reports for a process killed by SIGKILL (128 + 9)

#: every failpoint in the code base: name -> the moment it marks (why a crash there matters)
POINTS: dict[str, str] = {
    "verifier.after_save_block": "decided block and commit stored; the application has not executed it",
    "verifier.after_finalize": "FinalizeBlock returned (state computed in memory); Commit not called",
    "verifier.after_commit": "the application committed; the node's height, WAL end-of-height and "
                             "mempool not yet updated",
    "verifier.before_sign": "the WAL holding every input is synced; the signature is not made yet",
    "verifier.after_sign": "the sign state is durable; the signed message is neither in the WAL nor sent",
    "verifier.after_sign_proposal": "as after_sign, for proposals only: the signer holds a signature for a "
                                    "block this node must propose again after a restart",
    "verifier.before_apply": "a block is decided and about to be executed (`raise` here: the application "
                             "fails on a decided block, and the member halts)",
}

ACTIONS = ("kill", "exit", "raise")


class FailpointSpecError(ValueError):
    """A malformed GT_FAILPOINTS value."""


class FailpointError(RuntimeError):
    """What an armed `raise` failpoint raises: a failure where the code must survive one."""


@dataclass(frozen=True)
class Arm:
    action: str  # one of ACTIONS
    on_hit: int  # fire on this hit (1 = the first)


def parse(spec: str) -> dict[str, Arm]:
    """`name=action[@n]` terms separated by ';' (blank terms ignored) -> armed failpoints."""
    armed: dict[str, Arm] = {}
    for term in (t.strip() for t in spec.split(";")):
        if not term:
            continue
        name, eq, rhs = (s.strip() for s in term.partition("="))
        if not eq or not name or not rhs:
            raise FailpointSpecError(f"failpoint term {term!r} is not name=action[@n]")
        if name not in POINTS:
            raise FailpointSpecError(f"unknown failpoint {name!r}; known: {', '.join(sorted(POINTS))}")
        if name in armed:
            raise FailpointSpecError(f"failpoint {name!r} armed twice")
        action, at, count = (s.strip() for s in rhs.partition("@"))
        if action not in ACTIONS:
            raise FailpointSpecError(f"failpoint {name!r}: action {action!r} is not one of {', '.join(ACTIONS)}")
        on_hit = 1
        if at:
            if not count.isdigit() or int(count) < 1:
                raise FailpointSpecError(f"failpoint {name!r}: '@{count}' must be a positive hit number")
            on_hit = int(count)
        armed[name] = Arm(action, on_hit)
    return armed


def spec(armed: dict[str, Arm]) -> str:
    """The GT_FAILPOINTS value that arms `armed` (inverse of parse)."""
    return ";".join(f"{name}={a.action}@{a.on_hit}" for name, a in armed.items())


_armed: dict[str, Arm] = parse(os.environ.get(ENV_VAR, ""))
_hits: dict[str, int] = {}


def hit(name: str) -> None:
    """Mark that the process is at failpoint `name`; dies here if it is armed for this hit."""
    if _armed and name in _armed:
        _fire(name, _armed[name])


def _fire(name: str, arm: Arm) -> None:
    n = _hits[name] = _hits.get(name, 0) + 1
    if n != arm.on_hit:
        return
    os.write(2, f"failpoint {name} fired ({arm.action} on hit {n})\n".encode())
    if arm.action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if arm.action == "raise":
        raise FailpointError(f"failpoint {name} fired")
    os._exit(EXIT_CODE)


def armed() -> dict[str, Arm]:
    """What this process has armed (for its start-up log line)."""
    return dict(_armed)
