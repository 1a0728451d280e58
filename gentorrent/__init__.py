"""GenTorrent: a decentralized, anonymous LLM serving overlay.

Pure cores (codecs, routing, reputation, consensus) live beside thin async shells
(gRPC services, timers, vLLM, disk); see DESIGN.md §2.
"""

__version__ = "0.1.0"
