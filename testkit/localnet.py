"""A small overlay of user nodes on 127.0.0.1, for tests and benchmarks.

`start_user_nodes` starts user nodes (real Relay servers over pinned TLS) sharing one static
directory file; the stand-in model node that answers them is testkit.echo_model.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from gentorrent.config import CLOVES, OVERLAY, CloveParams, OverlayParams
from gentorrent.ledger.directory import StaticDirectory
from user_client.node import UserNode


async def start_user_nodes(count: int, directory_path: Path, base_dir: Path, region: str = "default",
                           cloves: CloveParams = CLOVES, params: OverlayParams = OVERLAY,
                           build_paths: bool = False, **kwargs) -> list[UserNode]:
    """`count` user nodes registered in the static directory at `directory_path`."""
    nodes = [UserNode(Path(base_dir) / f"user{i}", StaticDirectory(directory_path), region=region,
                      cloves=cloves, params=params, **kwargs) for i in range(count)]
    for node in nodes:
        await node.start(build_paths=False)
    for node in nodes:
        await node.refresh_directory()
    if build_paths:
        await asyncio.gather(*(n.paths.fill() for n in nodes))
    return nodes
