"""Fuzz oracles: one module per decoder, each with `check(data: bytes) -> None`.

An oracle turns an arbitrary byte string into calls of one decoder and asserts the
decoder's contract: only its documented ValueError subclass comes out, valid inputs still
decode, and a rejected input changes no state. `check` returns normally when the contract
holds and raises anything else (a `Finding`, or the decoder's unexpected exception) when it
does not. The same oracles are driven three ways:

* coverage-guided by atheris: `python fuzz/<target>.py -max_total_time=600` (fuzz/README.md);
* property-based by hypothesis in `tests/test_fuzz_<target>.py` (seconds, part of make test);
* replayed from `tests/data/fuzz_regressions/<target>/` (every crash ever found).

Oracles are pure (no I/O beyond what the decoder does, no clock): randomness comes from the
input bytes through `Draw`, so a crashing input replays exactly.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import inspect
import signal
from importlib import import_module
from pathlib import Path
from types import ModuleType
from typing import Callable, Iterator, NamedTuple, Sequence, TypeVar

#: the registry of targets: name -> module under testkit.fuzzing
TARGETS: tuple[str, ...] = ("sida", "onion", "settings", "abci_framing", "hrtree", "consensus")

REGRESSIONS = Path(__file__).resolve().parents[2] / "tests" / "data" / "fuzz_regressions"

T = TypeVar("T")


class Finding(AssertionError):
    """The decoder broke its contract on this input (a bug to report, not a test error)."""


class Hang(Finding):
    """One decoder call used more CPU time than any honest input needs."""


def oracle(target: str) -> ModuleType:
    if target not in TARGETS:
        raise KeyError(f"unknown fuzz target {target!r}; known: {', '.join(TARGETS)}")
    return import_module(f"testkit.fuzzing.{target}")


def regression_inputs(target: str) -> list[Path]:
    """Files of tests/data/fuzz_regressions/<target>/ (each one raw input to `check`)."""
    folder = REGRESSIONS / target
    return sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith(".")) if folder.is_dir() else []


@contextlib.contextmanager
def cpu_budget(seconds: float, what: str) -> Iterator[None]:
    """Raise `Hang` if the block burns more than `seconds` of CPU time.

    ITIMER_PROF (SIGPROF) counts CPU time, so a loaded machine does not cause false alarms,
    and it leaves SIGALRM to pytest-timeout and libFuzzer's own -timeout. Main thread only;
    elsewhere (or without setitimer) the block simply runs unbounded.
    """
    def _fire(signum, frame):  # noqa: ARG001
        raise Hang(f"{what} used more than {seconds} s of CPU")

    try:
        previous = signal.signal(signal.SIGPROF, _fire)
    except (ValueError, AttributeError):  # not the main thread / no SIGPROF
        yield
        return
    signal.setitimer(signal.ITIMER_PROF, seconds)
    try:
        yield
    except Hang as exc:
        # re-raised from here: a signal can land where a frame has no line number, and such
        # tracebacks break pytest's reporting; keep the function names of where it was
        names, tb = [], exc.__traceback__
        while tb is not None:
            names.append(tb.tb_frame.f_code.co_name)
            tb = tb.tb_next
        raise Hang(f"{exc} (in {' > '.join(names[-6:])})") from None
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, previous)


class Draw:
    """Consumes an input byte string as a sequence of choices; zeros once it runs out.

    The same role as atheris.FuzzedDataProvider, written here so oracles (and the hypothesis
    tests that call them) do not need atheris installed.
    """

    def __init__(self, data: bytes) -> None:
        self._data = bytes(data)
        self._pos = 0

    @property
    def remaining(self) -> int:
        return len(self._data) - self._pos

    def bytes(self, n: int) -> bytes:
        out = self._data[self._pos:self._pos + max(0, n)]
        self._pos += len(out)
        return out + bytes(max(0, n) - len(out))

    def uint(self, nbytes: int = 1) -> int:
        return int.from_bytes(self.bytes(nbytes), "big")

    def below(self, n: int) -> int:
        """An integer in 0..n-1 (n >= 1)."""
        width = max(1, (max(n - 1, 1).bit_length() + 7) // 8)
        return self.uint(width) % n

    def between(self, lo: int, hi: int) -> int:
        return lo + self.below(hi - lo + 1)

    def flag(self) -> bool:
        return bool(self.uint(1) & 1)

    def choice(self, items: Sequence[T]) -> T:
        return items[self.below(len(items))]

    def blob(self, max_len: int) -> bytes:
        """A length (bounded) then that many bytes."""
        return self.bytes(self.below(max_len + 1))

    def rest(self) -> bytes:
        out = self._data[self._pos:]
        self._pos = len(self._data)
        return out

    def rng(self, label: bytes = b"") -> "DrawRng":
        return DrawRng(self.bytes(16) + label)


class DrawRng:
    """A deterministic `rng(nbytes) -> bytes` (the codecs' randomness parameter) from a seed."""

    def __init__(self, seed: bytes) -> None:
        self._seed = seed
        self._counter = 0

    def __call__(self, n: int) -> bytes:
        self._counter += 1
        return hashlib.shake_256(self._seed + self._counter.to_bytes(8, "big")).digest(n)


def expect(condition: bool, message: str) -> None:
    if not condition:
        raise Finding(message)


# --------------------------------------------------------------------------- known open bugs


class KnownBug(NamedTuple):
    """A finding reported to the lead and not fixed yet (its owner fixes it, not the fuzzer).

    While listed, long fuzz runs and the hypothesis tests skip inputs that hit it (so they
    keep looking for *other* bugs); the regression input under tests/data/fuzz_regressions/
    replays it against the full oracle as a strict xfail, which turns red once the bug is
    fixed: then delete the entry here.
    """

    target: str
    exception: str  # class name of what check() raises
    message: str  # a substring of its message
    regression: str  # name prefix of its input files under tests/data/fuzz_regressions/<target>/
    summary: str


KNOWN_OPEN: tuple[KnownBug, ...] = (
    # none open: sida (expect= and a decode budget), settings (control characters escaped) and
    # consensus (rounds bounded by max_rounds_ahead, signature checked before proposer) fixed
)


def known_bug(target: str, exc: BaseException) -> KnownBug | None:
    text = str(exc)
    for bug in KNOWN_OPEN:
        if bug.target == target and type(exc).__name__ == bug.exception and bug.message in text:
            return bug
    return None


def filtered_check(target: str) -> Callable[[bytes], bool]:
    """check() of `target` that swallows known open bugs; returns False when it did."""
    check = oracle(target).check
    if "avoid_known" in inspect.signature(check).parameters:  # it can steer clear of them itself
        check = functools.partial(check, avoid_known=any(bug.target == target for bug in KNOWN_OPEN))

    def run(data: bytes) -> bool:
        try:
            check(data)
        except Exception as exc:  # noqa: BLE001 - re-raised unless a listed open bug
            if known_bug(target, exc) is None:
                raise
            return False
        return True

    return run
