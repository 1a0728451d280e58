"""Conversations of `gt-user ask --session NAME`, kept on the user's own node (pure).

A model node keeps nothing between asks (it must not: it would learn which asks belong
together beyond what one ask shows). So the history of a session lives here, with the user,
and each turn sends all of it: the model node's prefix cache still holds the conversation so
far, because the session's turns go to the same node (affinity, `api_requests.conversation_key`).
Bounded in number of sessions, in bytes per session (the oldest turns go first; the system
prompt stays) and in idle time; the clock is injected.
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
    used: float = 0.0


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

    def record(self, name: str, sent: tuple[Turn, ...], reply: str) -> None:
        """After an answer: the conversation is what was sent plus the reply."""
        turns = list(sent) + [("assistant", reply)]
        self._sessions.pop(name, None)
        self._sessions[name] = _Session(_trim(turns, self.params.max_session_bytes), self.clock())
        while len(self._sessions) > self.params.max_sessions:
            self._sessions.popitem(last=False)

    def forget(self, name: str) -> bool:
        return self._sessions.pop(name, None) is not None

    def _expire(self) -> None:
        now = self.clock()
        for name in [n for n, s in self._sessions.items() if now - s.used > self.params.session_idle_s]:
            del self._sessions[name]


def _size(turns: list[Turn]) -> int:
    return sum(len(c.encode()) for _, c in turns)


def _trim(turns: list[Turn], limit: int) -> list[Turn]:
    """Drop the oldest exchanges (never the system prompt, never the last exchange) until the
    history fits `limit` bytes."""
    system = [t for t in turns[:1] if t[0] == "system"]
    rest = turns[len(system):]
    while _size(system + rest) > limit and len(rest) > 2:
        rest = rest[2:] if rest[0][0] == "user" else rest[1:]
    return system + rest
