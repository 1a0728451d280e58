"""Helpers of the real-network consensus tests: free loopback ports, registering members."""

from __future__ import annotations

import random
import socket

from gentorrent.crypto.keys import Identity, OnionKey
from gentorrent.crypto.tls import make_self_signed
from verifier.abci import txs


def free_base_port(n: int) -> int:
    for _ in range(200):
        base = random.randrange(20000, 60000)
        socks = []
        try:
            for i in range(n):
                s = socket.socket()
                s.bind(("127.0.0.1", base + i))
                socks.append(s)
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free port range")


class Member:
    """A user node registering with the committee (its own identity, onion key and cert)."""

    def __init__(self, k: int) -> None:
        self.identity = Identity.generate()
        self.onion = OnionKey.generate()
        self.cert = make_self_signed(self.identity).cert_pem
        self.address = f"127.0.0.1:{30000 + k}"

    def register(self) -> bytes:
        return txs.register_user(self.identity, self.address, self.onion.public_key, self.cert, "eu-west", 1)
