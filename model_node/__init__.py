"""A model node: one whole LLM served by vLLM over gRPC/TLS (DESIGN.md §1, §3.4; issue 3).

- `catalogue`: model names -> weights on disk (embedded GGUFs converted once, HF ids never
  downloaded at run time);
- `engine`: the vLLM wrapper (streaming generation, one-pass scoring, load report);
- `inputs`, `receipts`: pure request validation and signed reply receipts;
- `service`: `LocalGenerator` (the one path that serves and signs a GenerateRequest; the
  overlay's clove intake and the routing forwarder call it) and the ModelNode servicer;
- `cli`: `gt-model serve | status | models`.
"""
