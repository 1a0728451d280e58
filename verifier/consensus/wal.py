"""Write-ahead log of the consensus inputs of the height in progress.

Every input that can change what this node signs (messages received, own signed messages,
timeouts fired) is appended before it is handed to the driver. Appends are buffered; `sync`
(flush + fsync) runs before every signature (the PrivValidator's `before_sign`), so all the
inputs that led to a signature are durable before the signature exists. A node killed at any
point restarts, replays the inputs of its current height (and the early messages of the next
one, which go back into the driver's next-height buffer) through a fresh driver, reaches the
same locked/valid state, and re-signs only what it already signed (same bytes).

Record: u32 length, u32 CRC-32 of the payload, payload. A torn or corrupt tail (a crash in
the middle of a write) ends the log there and is cut off on open. Payload kinds: a consensus
message (types.encode_message), a timeout (step, height, round), a timeliness verdict (height,
round, block hash, timely: the clock's say on a live proposal, so that replay never asks the
clock again), and an end-of-height marker written after a block is applied; the file is
rotated at such a marker when it grows large.
"""

from __future__ import annotations

import logging
import os
import struct
import zlib
from pathlib import Path

from verifier.consensus.driver import Timeliness, TimeoutFired
from gentorrent.ledger.chain import (HASH_BYTES, DecodeError, Proposal, Reader, Step, Vote, Writer,
                                      decode_message, encode_message)

log = logging.getLogger(__name__)

_MSG, _TIMEOUT, _END_HEIGHT, _TIMELY = 1, 2, 3, 4
_HEADER = struct.Struct(">II")
MAX_RECORD = 8 * 1024 * 1024
ROTATE_BYTES = 8 * 1024 * 1024

Event = Proposal | Vote | TimeoutFired | Timeliness


class WriteAheadLog:
    def __init__(self, path: Path, rotate_bytes: int = ROTATE_BYTES) -> None:
        self.path = Path(path)
        self.rotate_bytes = rotate_bytes
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._records, valid_len = self._read_valid()
        ends = [i for i, e in enumerate(self._records) if isinstance(e, int)]
        #: events written after the last end-of-height marker: the only ones a rotation can keep
        #: (a node logs inputs of its current height and early ones of the next, never later)
        self._since_end: list[Event] = self._records[ends[-1] + 1:] if ends else list(self._records)
        with open(self.path, "ab") as f:
            if f.tell() != valid_len:
                log.warning("WAL %s: cutting a torn tail of %d bytes", self.path, f.tell() - valid_len)
                f.truncate(valid_len)
        self._f = open(self.path, "ab", buffering=64 * 1024)
        self._dirty = False
        self.syncs = 0

    # -- writing

    def append(self, event: Event) -> None:
        self._write(_encode(event))
        self._since_end.append(event)

    def end_height(self, height: int) -> None:
        """Block `height` is applied: its inputs are no longer needed. (Not synced: replay
        selects records by height, the marker only tells where the log may be cut.)"""
        self._write(Writer().u8(_END_HEIGHT).u64(height).done())
        later = [e for e in self._since_end if e.height > height]  # (early inputs of height + 1)
        self._since_end = []
        if self._f.tell() > self.rotate_bytes:
            self._rotate(height, later)
            self._since_end = later

    def sync(self) -> None:
        if not self._dirty:
            return
        self._f.flush()
        os.fsync(self._f.fileno())
        self._dirty = False
        self.syncs += 1

    def close(self) -> None:
        try:
            self.sync()
        finally:
            self._f.close()

    def _write(self, payload: bytes) -> None:
        self._f.write(_HEADER.pack(len(payload), zlib.crc32(payload)) + payload)
        self._dirty = True

    def _rotate(self, height: int, later: list[Event]) -> None:
        """Start a fresh file (atomic rename) holding the end marker and the records of later
        heights that arrived early: they are inputs of the next height, like any other."""
        self._f.flush()
        tmp = self.path.with_suffix(".rotating")
        with open(tmp, "wb") as f:
            for payload in [Writer().u8(_END_HEIGHT).u64(height).done()] + [_encode(e) for e in later]:
                f.write(_HEADER.pack(len(payload), zlib.crc32(payload)) + payload)
            f.flush()
            os.fsync(f.fileno())
        self._f.close()
        os.replace(tmp, self.path)
        dfd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
        self._f = open(self.path, "ab", buffering=64 * 1024)

    # -- reading

    def events_for_height(self, height: int) -> list[Event]:
        """The recorded inputs of `height`, in the order they happened (read at open)."""
        return [e for e in self._records if not isinstance(e, int) and e.height == height]

    def replay_from(self, height: int) -> list[Event]:
        """What a node restarting at `height` replays (Driver.start_height): the inputs of that
        height and the messages of the next one that arrived early, in the order they were
        handled. Early messages are inputs like any other: a node that restarts at `height`
        must hold them again, or it would run the next height without them while its log says
        it had them first, and a restart during that height would replay another history."""
        return [e for e in self._records if not isinstance(e, int) and height <= e.height <= height + 1]

    def _read_valid(self) -> tuple[list[Event | int], int]:
        if not self.path.exists():
            return [], 0
        data = self.path.read_bytes()
        out: list[Event | int] = []
        pos = 0
        while pos + _HEADER.size <= len(data):
            length, crc = _HEADER.unpack_from(data, pos)
            end = pos + _HEADER.size + length
            if length > MAX_RECORD or end > len(data):
                break
            payload = data[pos + _HEADER.size:end]
            if zlib.crc32(payload) != crc:
                break
            try:
                out.append(_decode(payload))
            except (DecodeError, ValueError) as exc:
                log.warning("WAL %s: undecodable record at %d: %s", self.path, pos, exc)
                break
            pos = end
        return out, pos


def _encode(event: Event) -> bytes:
    if isinstance(event, TimeoutFired):
        return Writer().u8(_TIMEOUT).u8(event.step).u64(event.height).u32(event.round).done()
    if isinstance(event, Timeliness):
        return (Writer().u8(_TIMELY).u64(event.height).u32(event.round).blob(event.block_hash)
                .u8(int(event.timely)).done())
    return bytes([_MSG]) + encode_message(event)


def _decode(payload: bytes) -> Event | int:
    if not payload:
        raise DecodeError("empty WAL record")
    kind = payload[0]
    if kind == _MSG:
        return decode_message(payload[1:])
    r = Reader(payload[1:])
    if kind == _TIMEOUT:
        ev = TimeoutFired(Step(r.u8()), r.u64(), r.u32())
    elif kind == _END_HEIGHT:
        ev = r.u64()
    elif kind == _TIMELY:
        height, round_, block_hash, timely = r.u64(), r.u32(), r.fixed_or_empty(HASH_BYTES), r.u8()
        if timely > 1 or not block_hash:
            raise DecodeError("malformed timeliness record")
        ev = Timeliness(height, round_, block_hash, bool(timely))
    else:
        raise DecodeError(f"unknown WAL record kind {kind}")
    r.end()
    return ev
