"""What a colluding set links on the real overlay, measured as sims/linkability.py models it.

One honest user asks through an overlay of in-process user nodes (real relays over mutual TLS,
the shipped path manager and asker) to the echo model node. Some relays and the model node
collude: each colluding relay records the forward cloves it receives (when, from which
neighbour, and what the frame tells about that neighbour), the model node records when it
decoded each ask. Per ask the adversary names a sender when a colluder that knows it is the
first hop saw one of the ask's cloves just before the model node decoded it; the measurement
is how many asks it named, rightly and wrongly. The user's renewal periods go by on the path
manager's clock (the relays' clocks are real), so a short test covers many of them.

`linking_setup` is the simulator's description of the same set-up, so a test can check that the
measured share falls inside the simulator's interval (tests/test_linkability_overlay.py).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from testkit.scenarios.adversary_path import PROMPT, Net


def linking_setup(users: int, colluders: int, windows: int, asks_per_window: int, cloves):
    """sims.linkability.Setup for one asker among `users` nodes, `colluders` of them colluding,
    asking `asks_per_window` times in each of `windows` renewal periods (no churn)."""
    import math

    from sims.linkability import Setup

    period = cloves.path_renewal_s
    times = tuple(w * period + (j + 1) * period / (asks_per_window + 1)
                  for w in range(windows) for j in range(asks_per_window))
    return Setup(users=users, f=colluders / users, n=cloves.n, l=cloves.path_length, kept=cloves.proxies_kept,
                 renewal_s=period, horizon_s=windows * period, observed=1, lifetime_s=math.inf,
                 ask_schedule=times)


async def measure_linking(root: Path, users: int = 20, colluders: int = 4, windows: int = 12,
                          asks_per_window: int = 2, cloves=None, guards: bool = True, **params) -> dict:
    """Ask `windows` x `asks_per_window` times; what the colluders named (see the module doc).
    `guards` False: the asker draws a first hop per path (the code before entry guards);
    `params`: changes to the overlay's parameters (hide_position=False: before position hiding)."""
    from gentorrent.ledger.peers import USER

    async with Net(root, users=users, cloves=cloves, **params) as net:
        loop = asyncio.get_running_loop()
        me, gang = net.me, net.nodes[1:1 + colluders]
        if not guards:
            me.paths.guards = None
        seen: list[tuple[float, str, bool]] = []  # (time, predecessor, the frame asked for an ack)
        for node in gang:
            relay = node.relay

            def recording(link, batch, _on=relay.on_cloves):
                if batch.forward and link.peer.role == USER:
                    seen.append((loop.time(), link.peer.node_id, bool(batch.batch)))
                return _on(link, batch)

            relay.on_cloves = recording
        decoded: list[float] = []
        generate = net.model.intake.generate

        def colluding_generate(request, _g=generate):
            decoded.append(loop.time())
            return _g(request)

        net.model.intake.generate = colluding_generate
        shift = [0.0]
        me.paths.clock = lambda: time.monotonic() + shift[0]
        tally: dict = {}
        named = wrong = asks = 0
        for w in range(windows):
            for j in range(asks_per_window):
                start = len(seen)
                before = len(decoded)
                await net.ask(tally, f"{PROMPT} {w}.{j}")
                asks += 1
                if len(decoded) == before:
                    continue
                at = decoded[before]
                names = {pred for t, pred, first in seen[start:] if first and t <= at}
                named += me.node_id_hex in names
                wrong += len(names - {me.node_id_hex})
            shift[0] += net.cloves.path_renewal_s + 1.0  # the next renewal period: every path is stale
    return {"asks": asks, "named": named, "wrong": wrong, "answered": tally.get("answered", 0),
            "windows": windows, "asks_per_window": asks_per_window, "users": users, "colluders": colluders}
