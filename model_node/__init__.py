"""A model node: one whole LLM served by vLLM over gRPC/TLS (ARCHITECTURE.md §1, §3.4).

catalogue   model names -> weights on disk (embedded GGUFs converted once, never downloaded)
engine      the vLLM wrapper (streaming generation, one-pass scoring, load report)
service     `LocalGenerator` (prepares a request once, serves and signs it) and the servicer
intake      cloves in from the overlay, reply cloves out to the users' proxies
forwarding  serve here or at the group peer holding the prefix (Algorithm 2)
gossip      signed HR-tree deltas and load among the group's members
cli         `gt-model serve | status | models`; `Serving`, the seam a test double of a
            dishonest node plugs into (testkit/dishonest_model.py)
"""
