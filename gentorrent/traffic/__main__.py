"""`python -m gentorrent.traffic`: the corpus's shares of request shapes, measured (one JSON line)."""

from __future__ import annotations

import json

from gentorrent.config import TRAFFIC
from gentorrent.traffic.corpus import load_corpus, turn_shares
from gentorrent.traffic.model import looks_like_code


def main() -> dict:
    corpus = load_corpus()
    convs = corpus.challenge + corpus.holdout
    firsts = [type(c)(c.key, tuple(t for t in c.turns if t[0] == "user")[:1]) for c in convs]
    return {"conversations": len(convs), "challenge_pool": len(corpus.challenge), "holdout_pool": len(corpus.holdout),
            "user_turn_shares": turn_shares(convs, TRAFFIC.long_document_chars, looks_like_code),
            "first_turn_shares": turn_shares(firsts, TRAFFIC.long_document_chars, looks_like_code)}


if __name__ == "__main__":
    print(json.dumps(main()))
