"""GenTorrent's base package: what every role shares, and nothing of any role.

Configuration and settings, metrics, wire code, crypto, pinned-TLS channels, the request
format, reply receipts, the pure overlay and routing cores, and the ledger every node reads
(genesis, chain types, the registry's records, transactions, the light client, directories).
The roles (user_client, model_node, verifier) build on it side by side; ARCHITECTURE.md §1.
"""

__version__ = "0.1.0"
