"""Where a user node learns who the relays and model nodes are (ARCHITECTURE.md §3.1).

Every role sees only the small `Directory` interface below. Two implementations:
`CommitteeDirectory` (gentorrent.ledger.committee), the committee's light-client-checked
registry, which is what every node of a network uses; and `StaticDirectory`, a JSON file, kept
for tests and benchmarks that exercise the overlay without a committee. Registering a user
node adds it to whichever directory it uses, so other users can pick it as a relay.
"""

from __future__ import annotations

import fcntl
import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Protocol

from gentorrent.ledger.sections import ModelRecord, UserRecord

MAX_DIRECTORY_BYTES = 64 * 1024 * 1024


class DirectoryError(ValueError):
    """A directory file or answer is malformed."""


class Directory(Protocol):
    """What a role reads of the registry: only what it uses (ARCHITECTURE.md §3.1). `users()` and
    `models()` are the records this node holds (a relay sample, peers met, followed rosters),
    never the whole registry; `refresh` brings them up to date."""

    def users(self) -> list[UserRecord]: ...

    def models(self) -> list[ModelRecord]: ...

    async def refresh(self) -> None: ...

    async def follow(self, model: str) -> list[ModelRecord]:
        """The roster of `model`, held from now on and kept fresh by `refresh`."""

    async def user(self, node_id: bytes) -> UserRecord | None:
        """A peer's user record by node id (looked up when not held), or None."""

    async def model(self, node_id: bytes) -> ModelRecord | None: ...

    async def register_user(self, record: UserRecord) -> None: ...

    async def close(self) -> None: ...


# --------------------------------------------------------------------------- JSON encoding

_BYTES_HEX = ("node_id", "public_key", "onion_key")


def _encode(record: UserRecord | ModelRecord) -> dict:
    d = asdict(record)
    for name in _BYTES_HEX:
        d[name] = d[name].hex()
    return d


def _decode(cls, d: dict):
    try:
        fields = dict(d)
        for name in _BYTES_HEX:
            fields[name] = bytes.fromhex(fields[name])
        return cls(**fields)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise DirectoryError(f"malformed {cls.__name__} entry: {exc}") from exc


class StaticDirectory:
    """A directory kept in one JSON file: {"users": [...], "models": [...]}.

    `refresh` re-reads the file, `register_user` / `add_model` rewrite it under an exclusive
    lock (atomic rename), so several processes on one machine can share it.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._users: list[UserRecord] = []
        self._models: list[ModelRecord] = []
        self._stamp: tuple[int, int, int] | None = None
        if self.path.exists():
            self._load()

    def users(self) -> list[UserRecord]:
        return list(self._users)

    def models(self) -> list[ModelRecord]:
        return list(self._models)

    async def refresh(self) -> None:
        self._load()

    async def follow(self, model: str) -> list[ModelRecord]:
        return [m for m in self._models if m.model == model]

    async def user(self, node_id: bytes) -> UserRecord | None:
        self._load()
        return next((u for u in self._users if u.node_id == node_id), None)

    async def model(self, node_id: bytes) -> ModelRecord | None:
        self._load()
        return next((m for m in self._models if m.node_id == node_id), None)

    async def register_user(self, record: UserRecord) -> None:
        self._update(lambda doc: _upsert(doc.setdefault("users", []), _encode(record)))

    def add_model(self, record: ModelRecord) -> None:
        self._update(lambda doc: _upsert(doc.setdefault("models", []), _encode(record)))

    async def close(self) -> None:
        """Nothing to stop: a file has no leases."""

    def _read(self) -> dict:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return {"users": [], "models": []}
        if len(raw) > MAX_DIRECTORY_BYTES:
            raise DirectoryError(f"{self.path}: larger than {MAX_DIRECTORY_BYTES} bytes")
        try:
            doc = json.loads(raw or b"{}")
        except json.JSONDecodeError as exc:
            raise DirectoryError(f"{self.path}: not JSON: {exc}") from exc
        if not isinstance(doc, dict):
            raise DirectoryError(f"{self.path}: not a JSON object")
        return doc

    def _load(self) -> None:
        try:
            st = self.path.stat()
            stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        except FileNotFoundError:
            stamp = None
        if stamp is not None and stamp == self._stamp:
            return  # unchanged since the last read: nodes refresh often, the file rarely changes
        doc = self._read()
        self._users = [_decode(UserRecord, d) for d in doc.get("users", [])]
        self._models = [_decode(ModelRecord, d) for d in doc.get("models", [])]
        self._stamp = stamp

    def _update(self, change) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_suffix(".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            doc = self._read()
            change(doc)
            tmp = self.path.with_suffix(f".tmp{os.getpid()}")
            tmp.write_text(json.dumps(doc, indent=1))
            os.replace(tmp, self.path)
        self._load()


def _upsert(entries: list[dict], entry: dict) -> None:
    entries[:] = [e for e in entries if e.get("node_id") != entry["node_id"]] + [entry]
