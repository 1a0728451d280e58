"""A live committee with a dashboard that nobody reads (tests/test_dashboard.py, bench/dashboard.py).

Four in-process verifiers with scripted epochs (testkit.epochs), an honest and a cheating model
node, and node 0's `LiveDashboard` started before the first epoch: whatever its history holds
afterwards was recorded from committed blocks, not from page views.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import AsyncIterator

from gentorrent.crypto.keys import Identity
from testkit.epochs import EpochCommittee, ScriptedModels
from verifier.dashboard_live import LiveDashboard


@dataclass
class Watched:
    committee: EpochCommittee
    live: LiveDashboard
    honest: Identity
    cheat: Identity

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.live.port}/"


@contextlib.asynccontextmanager
async def watched_committee(root: Path, epochs: int = 3, timeout: float = 150.0) -> AsyncIterator[Watched]:
    """Yields once `epochs` epochs have closed; stops everything on the way out."""
    models = ScriptedModels()
    honest, cheat = models.add("honest"), models.add("cheat")
    committee = EpochCommittee(root)
    live = None
    try:
        await committee.start(models)
        live = LiveDashboard(committee.nodes[0], poll_s=0.1)
        await live.start("127.0.0.1:0")
        await committee.register(honest, 9001)
        await committee.register(cheat, 9002)
        await committee.wait_epochs(epochs, timeout=timeout)
        await asyncio.sleep(0.5)  # the recorder's next poll
        yield Watched(committee, live, honest, cheat)
    finally:
        if live is not None:
            await live.stop()
        await committee.stop()
