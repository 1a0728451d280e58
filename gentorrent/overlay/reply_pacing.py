"""When a model node lets a streamed answer's reply messages go (pure; time passed in).

A reply message costs the whole path a sealing, an S-IDA split, n cloves and a layer at every
hop each way, whatever it carries, so an answer should cost about as many messages as a relay
may learn anyway, not one per token nor one per clock tick. The rule (ARCHITECTURE.md §2
step 7, THREAT_MODEL.md "Token count and timing"):

* the first chunk leaves at once: its time is the prompt's (time to first token is what a
  user feels), not a token's;
* every later chunk waits for the next point of a grid of `window_s` (the streaming
  granularity, `OverlayParams.reply_window_s`) anchored at the first message; what arrived
  since the last message leaves there as one message; a grid point with nothing to say sends
  nothing (no empty message, ever);
* the final chunk (it carries the receipt) or an error leaves at once, with whatever waits.

So a token waits at most `window_s`; an answer of duration D costs at most D / window_s + 2
messages; and a relay learns the time of the first and the last message, and which grid
slots had tokens in them -- not when within a slot a token came, nor how many came. For a
generation faster than one token per window (every slot full) that is exactly what a cadence
of one message per window, empty or not, would show; only pauses of a window or more are
visible (measured in bench/reply_timing.py).

`ReplyPacer` only decides; the clove intake (model_node/intake.py) sleeps until `due_at` and
releases what `take` returns at its one release point (`CloveIntake._release`).
"""

from __future__ import annotations

import math

from gentorrent.wire import gentorrent_pb2 as pb


def merge_chunks(chunks: list[pb.GenerateChunk]) -> pb.GenerateChunk:
    """Chunks generated since the last reply message, as one chunk (text and tokens in order;
    the end, its receipt and any error from the last that has them)."""
    if len(chunks) == 1:
        return chunks[0]
    merged = pb.GenerateChunk()
    for chunk in chunks:
        merged.text += chunk.text
        merged.token_ids.extend(chunk.token_ids)
        merged.logprobs.extend(chunk.logprobs)
        merged.top_logprobs.extend(chunk.top_logprobs)
        merged.tool_calls.extend(chunk.tool_calls)
        for name in ("served_by", "finish_reason", "error", "max_model_len"):
            if getattr(chunk, name):
                setattr(merged, name, getattr(chunk, name))
        if chunk.HasField("receipt"):
            merged.receipt.CopyFrom(chunk.receipt)
        merged.final = merged.final or chunk.final or bool(chunk.error)
    return merged


class ReplyPacer:
    """The reply messages of one answer: chunks in (with the time they came), messages out."""

    __slots__ = ("window_s", "_pending", "_first_at", "_anchor", "_slot", "_done", "sent")

    def __init__(self, window_s: float) -> None:
        if not window_s > 0:
            raise ValueError("the reply window must be positive")
        self.window_s = window_s
        self._pending: list[pb.GenerateChunk] = []
        self._first_at: float | None = None  # when the oldest pending chunk came
        self._anchor: float | None = None  # when the first message left: the grid's origin
        self._slot = 0  # grid point of the last message
        self._done = False
        self.sent = 0  # messages released

    @property
    def finished(self) -> bool:
        """The final message left: nothing more will."""
        return self._done

    def add(self, chunk: pb.GenerateChunk, now: float) -> None:
        """A chunk came from the engine at `now`."""
        if self._done:
            raise ValueError("the answer already ended")
        if not self._pending:
            self._first_at = now
        self._pending.append(chunk)

    def end(self, error: str, now: float) -> None:
        """Generation stopped without a final chunk (the engine failed, or just ended): the
        next message is the last, and says so."""
        if not self._done and not any(c.final or c.error for c in self._pending):
            self.add(pb.GenerateChunk(final=True, error=error), now)

    def due_at(self) -> float | None:
        """When the pending chunks must leave; None while nothing waits."""
        if self._done or not self._pending:
            return None
        last = self._pending[-1]
        if self._anchor is None or last.final or last.error:
            return self._first_at
        slot = max(self._slot + 1, math.ceil((self._first_at - self._anchor) / self.window_s))
        return self._anchor + slot * self.window_s

    def take(self, now: float) -> pb.GenerateChunk | None:
        """The next reply message's chunk if one is due at `now` (never an empty one), else None."""
        due = self.due_at()
        if due is None or now < due:
            return None
        chunk = merge_chunks(self._pending)
        self._pending = []
        if self._anchor is None:
            self._anchor = now
        else:
            self._slot = max(self._slot, math.floor((now - self._anchor) / self.window_s))
        self._done = bool(chunk.final or chunk.error)
        if chunk.error:
            chunk.final = True
        self.sent += 1
        return chunk
