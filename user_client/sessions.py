"""Conversations of `gt-user ask --session NAME`, kept on the user's own node (pure).

A model node keeps nothing between asks (it must not: it would learn which asks belong
together beyond what one ask shows). So the history of a session lives here, with the user,
and each turn sends all of it: the model node's prefix cache still holds the conversation so
far, because the session's turns go to the same node (affinity, `api_requests.conversation_key`).
Bounded in number of sessions, in bytes per session (the oldest turns go first; the system
prompt stays) and in idle time; the clock is injected. Each answer keeps a note of where it
came from (the serving node, its reputation then, the paths its cloves took), which the chat
page shows; notes never leave the node either.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable

from gentorrent.config import USER_API, UserApiParams

Turn = tuple[str, str]  # (role, content)


@dataclass
class _Session:
    turns: list[Turn] = field(default_factory=list)
    notes: list[dict | None] = field(default_factory=list)  # one per turn: an answer's origin, or None
    used: float = 0.0
    model: str = ""


class SessionStore:
    def __init__(self, params: UserApiParams = USER_API, clock: Callable[[], float] = time.monotonic) -> None:
        self.params = params
        self.clock = clock
        self._sessions: OrderedDict[str, _Session] = OrderedDict()

    def __len__(self) -> int:
        self._expire()
        return len(self._sessions)

    def history(self, name: str) -> list[Turn]:
        """The session's turns so far (empty for a new or forgotten session)."""
        self._expire()
        session = self._sessions.get(name)
        return list(session.turns) if session else []

    def record(self, name: str, sent: tuple[Turn, ...], reply: str, note: dict | None = None, model: str = "") -> None:
        """After an answer: the conversation is what was sent plus the reply (and its note)."""
        old = self._sessions.pop(name, None)
        known = old.notes if old is not None and old.turns == list(sent[:len(old.turns)]) else []
        turns = list(sent) + [("assistant", reply)]
        notes = (known + [None] * len(turns))[:len(turns) - 1] + [note]
        turns, notes = _trim(turns, notes, self.params.max_session_bytes)
        self._sessions[name] = _Session(turns, notes, self.clock(), model or (old.model if old else ""))
        while len(self._sessions) > self.params.max_sessions:
            self._sessions.popitem(last=False)

    def names(self) -> list[dict]:
        """Every session, the most recently used first: name, turns, model."""
        self._expire()
        return [{"name": n, "turns": len(s.turns), "model": s.model} for n, s in reversed(self._sessions.items())]

    def transcript(self, name: str) -> list[dict] | None:
        """A session's turns with their notes (None when there is no such session)."""
        self._expire()
        session = self._sessions.get(name)
        if session is None:
            return None
        return [{"role": r, "content": c, **({"note": n} if n else {})} for (r, c), n in zip(session.turns,
                                                                                         session.notes)]

    def forget(self, name: str) -> bool:
        return self._sessions.pop(name, None) is not None

    def _expire(self) -> None:
        now = self.clock()
        for name in [n for n, s in self._sessions.items() if now - s.used > self.params.session_idle_s]:
            del self._sessions[name]


def _size(turns: list[Turn]) -> int:
    return sum(len(c.encode()) for _, c in turns)


def _trim(turns: list[Turn], notes: list, limit: int) -> tuple[list[Turn], list]:
    """Drop the oldest exchanges (never the system prompt, never the last exchange) until the
    history fits `limit` bytes; the notes go with their turns."""
    keep = 1 if turns and turns[0][0] == "system" else 0
    rest, rest_notes = turns[keep:], notes[keep:]
    while _size(turns[:keep] + rest) > limit and len(rest) > 2:
        drop = 2 if rest[0][0] == "user" else 1
        rest, rest_notes = rest[drop:], rest_notes[drop:]
    return turns[:keep] + rest, notes[:keep] + rest_notes
