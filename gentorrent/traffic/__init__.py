"""Real user traffic: the corpus of real conversations (corpus), the traffic model that shapes
and parametrises requests as clients send them (model), the rewrite that keeps a challenge
from being the corpus text verbatim (transform), and the challenge draw that puts them together
(challenge: public, so anyone can label challenges; only the committee's seed is secret)."""

from gentorrent.traffic.corpus import Corpus, Conversation, load_corpus
from gentorrent.traffic.model import ChatRequest, Drawn, TrafficError, TrafficPool, draw
from gentorrent.traffic.transform import disguise

__all__ = ["Corpus", "Conversation", "load_corpus", "ChatRequest", "Drawn", "TrafficError", "TrafficPool", "draw",
           "disguise"]
