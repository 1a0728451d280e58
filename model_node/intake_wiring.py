"""A model node's clove intake, wired to a directory file (`gt-model serve --directory FILE`).

The intake (model_node.intake) needs the pinned TLS certificate of every proxy it
sends reply cloves to; proxies are user nodes, so their certificates come from the directory
the users registered in. On a devnet that is the shared static directory file; a proxy not
found there is looked up again after the intake re-reads the file (throttled; it may just
have registered).
"""

from __future__ import annotations

from pathlib import Path

from gentorrent.crypto.keys import NodeKeys
from gentorrent.channels import ChannelPool
from model_node.intake import CloveIntake, GenerateFn
from gentorrent.ledger.directory import DirectoryIndex, StaticDirectory


def intake_from_directory_file(keys: NodeKeys, generate: GenerateFn, directory_file: Path) -> CloveIntake:
    directory = StaticDirectory(Path(directory_file))
    index = DirectoryIndex(directory)

    async def reload() -> None:  # the intake calls this, throttled, for an unknown proxy
        await directory.refresh()
        index.rebuild()

    return CloveIntake(keys.onion, generate, index.relay_cert, ChannelPool(), refresh=reload)
