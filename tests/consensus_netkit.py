"""Helpers of the real-network consensus tests: free loopback ports, registering members."""

from __future__ import annotations

from gentorrent.crypto.keys import Identity, OnionKey
from testkit.committee import free_base_port  # noqa: F401  (tests import it from here)
from gentorrent.ledger import txs
from gentorrent.ledger.genesis import loopback_pow_nonce


class Member:
    """A user node registering with the committee (its own identity, onion key and cert)."""

    def __init__(self, k: int) -> None:
        self.identity = Identity.generate()
        self.onion = OnionKey.generate()
        self.address = f"127.0.0.1:{30000 + k}"

    def register(self, chain_id: str) -> bytes:
        return txs.register_user(self.identity, self.address, self.onion.public_key, "eu-west", 1,
                                 chain_id=chain_id, pow_nonce=loopback_pow_nonce(chain_id, self.identity.public_key))
