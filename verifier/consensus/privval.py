"""The validator's signer: it refuses to sign twice for one step, even across crashes.

Like CometBFT's FilePV, it keeps the last signed (height, round, step), the bytes signed and
the signature. A request for an older step is refused; a request for the same step is
answered with the stored signature if the bytes are the same and refused otherwise. With a
state file, the new state is written and fdatasynced *before* the signature is returned, so
no signature ever leaves the node that a restarted node does not know about. Before signing,
`before_sign` (the WAL's sync) runs, so every input that led to this signature is durable too.

The state file has two fixed-size slots written alternately, each with a sequence number and
a CRC: a write torn by a crash damages only the slot being written, and the other slot still
holds the previous state. The first write goes to slot 1 and slot 0 is written only after it
was durable, so "slot 0 never written, slot 1 invalid" is exactly a torn first write: its
signature never left (`sign` returns only after the fdatasync), so the node restarts as never
signed. Any other file without a valid slot is damage a crash cannot cause, and is refused. One in-place write and one fdatasync per signature (a temp file,
rename and directory fsync would cost three syncs, on the critical path of every height).
"""

from __future__ import annotations

import logging
import os
import struct
import zlib
from pathlib import Path
from typing import Callable

from gentorrent import failpoints
from gentorrent.crypto.keys import Identity
from verifier.consensus.driver import DoubleSignError
from gentorrent.ledger.chain import Step

log = logging.getLogger(__name__)


class PrivValidator:
    def __init__(self, identity: Identity, state_path: Path | None = None,
                 before_sign: Callable[[], None] | None = None) -> None:
        self.identity = identity
        self.state_path = Path(state_path) if state_path else None
        self.before_sign = before_sign
        self.last: tuple[int, int, int] = (0, 0, 0)
        self.last_bytes = b""
        self.last_signature = b""
        self.signed_count = 0
        self._seq = 0
        self._fd: int | None = None
        if self.state_path and self.state_path.exists():
            self._load()

    @property
    def public_key(self) -> bytes:
        return self.identity.public_key

    def sign(self, step: Step, height: int, round_: int, sign_bytes: bytes) -> bytes:
        hrs = (height, round_, int(step))
        if hrs < self.last:
            raise DoubleSignError(f"step {hrs} is older than the last signed step {self.last}")
        if hrs == self.last:
            if sign_bytes == self.last_bytes:
                return self.last_signature
            raise DoubleSignError(f"step {hrs} was already signed with other content")
        if self.before_sign:
            self.before_sign()
        failpoints.hit("verifier.before_sign")
        signature = self.identity.sign(sign_bytes)
        self._persist(hrs, sign_bytes, signature)
        failpoints.hit("verifier.after_sign")
        if step is Step.PROPOSE:
            failpoints.hit("verifier.after_sign_proposal")
        self.last, self.last_bytes, self.last_signature = hrs, sign_bytes, signature
        self.signed_count += 1
        return signature

    def _persist(self, hrs: tuple[int, int, int], sign_bytes: bytes, signature: bytes) -> None:
        if not self.state_path:
            return
        if len(sign_bytes) > _MAX_SIGN_BYTES:
            raise ValueError(f"sign bytes of {len(sign_bytes)} exceed the slot size")
        seq = self._seq + 1  # (counted only once durable: a failed write is retried in the same slot)
        body = _SLOT_HEAD.pack(_MAGIC, seq, hrs[0], hrs[1], hrs[2], len(sign_bytes))
        body += sign_bytes.ljust(_MAX_SIGN_BYTES, b"\0") + signature.ljust(64, b"\0")
        self._write_slot(body + struct.pack(">I", zlib.crc32(body)), (seq % 2) * _SLOT_BYTES)
        self._seq = seq

    def _write_slot(self, slot: bytes, offset: int) -> None:
        """Write one slot in place and make it durable (the one seam crash tests tear)."""
        if self._fd is None:
            self._fd = os.open(self.state_path, os.O_RDWR | os.O_CREAT, 0o600)
        os.pwrite(self._fd, slot, offset)
        os.fdatasync(self._fd)

    def _load(self) -> None:
        data = self.state_path.read_bytes()
        best = None
        for k in range(2):
            slot = data[k * _SLOT_BYTES:(k + 1) * _SLOT_BYTES]
            if len(slot) != _SLOT_BYTES or struct.unpack(">I", slot[-4:])[0] != zlib.crc32(slot[:-4]):
                continue
            magic, seq, h, r, step, n = _SLOT_HEAD.unpack_from(slot)
            if magic != _MAGIC or n > _MAX_SIGN_BYTES:
                continue
            off = _SLOT_HEAD.size
            if best is None or seq > best[0]:
                best = (seq, (h, r, step), slot[off:off + n], slot[off + _MAX_SIGN_BYTES:off + _MAX_SIGN_BYTES + 64])
        if best is None:
            if data[:_SLOT_BYTES].strip(b"\0"):
                raise ValueError(f"corrupt sign state {self.state_path}: no valid slot; refusing to start "
                                 "(a validator that forgets what it signed may double-sign). Restore the "
                                 "file from a backup, or, only if this key signed nothing since, delete it")
            if data.strip(b"\0"):  # slot 0 never written, slot 1 torn: the very first write
                log.warning("sign state %s: its first write was torn by a crash; nothing was signed with it "
                            "(a signature leaves only once its state is durable): starting as never signed",
                            self.state_path)
            return
        self._seq, self.last, self.last_bytes, self.last_signature = best

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


_MAGIC = b"GTPV"
_SLOT_HEAD = struct.Struct(">4sQQIBH")
_MAX_SIGN_BYTES = 384
_SLOT_BYTES = _SLOT_HEAD.size + _MAX_SIGN_BYTES + 64 + 4
