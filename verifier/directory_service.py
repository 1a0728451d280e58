"""The committee's answers to the registry's proven queries (ARCHITECTURE.md §3.1).

A light client believes an answer about the state after block H only with the header of block
H+1 (which carries that state's app hash) and the commit of H+1 (> 2/3 of the committee signed
the header). The app keeps the registry trees of its last few committed heights
(`RegistryApp.proven_heights`), so a query is answered at once for the newest height whose next
block is committed, one block behind the chain; only right after a restart, when the app holds
just its newest state, does the answer wait for the next block.
"""

from __future__ import annotations

from typing import Awaitable, Callable

from gentorrent.ledger import queries
from gentorrent.ledger.chain import Block, Commit, DirectoryProofCodec, ValidatorSet
from gentorrent.ledger.light_client import LIGHT_BLOCK_PATH
from gentorrent.ledger.light_verify import LightBlock, LightBlockCodec
from gentorrent.wire import gentorrent_pb2 as pb

#: the reply code when no certified height can be answered yet (the client asks another verifier)
CODE_NOT_YET = 1
#: the reply code of a verifier's own reads asked over the network (they are not served)
CODE_LOCAL = 21
#: the reply code of a light block asked for a height that is not a committed block's
CODE_NO_BLOCK = 22


def is_proven(path: str) -> bool:
    return path.startswith(queries.PREFIX)


def is_local(path: str) -> bool:
    """A verifier's own read of its whole state (sections.LOCAL_MODELS): never a network answer."""
    return path.startswith("/local/")


async def proven_reply(app, blocks, committed_height: int, wait_height: Callable[[int, float], Awaitable[bool]],
                       path: str, data: bytes, wait_s: float) -> pb.QueryReply:
    """The app's proven answer to (path, data) with the header and commit that certify it.
    `blocks.load_raw(h)` gives (block bytes, commit bytes) of a committed height."""
    provable = [h for h in getattr(app, "proven_heights", list)() if h + 1 <= committed_height]
    height = max(provable) if provable else committed_height
    q = app.query(path, data, height)
    if q.code != 0:
        return pb.QueryReply(code=q.code, log=q.log, height=q.height)
    height = q.height  # at height 0 ("the newest") the app may have committed past what the host counted
    if not provable and not await wait_height(height + 1, wait_s):
        return pb.QueryReply(code=CODE_NOT_YET, log=f"the committee has not committed block {height + 1} yet; retry")
    raw = blocks.load_raw(height + 1)
    if raw is None:  # no stored block with its commit to certify the answer (seen once in bench/scale.py's
        # live run under load; which path reaches it is not pinned down): a retry, never a crash
        return pb.QueryReply(code=CODE_NOT_YET, log=f"block {height + 1} is not stored with its commit yet; retry")
    proof = DirectoryProofCodec.encode(height, Block.decode(raw[0]).header.encode(), raw[1])
    return pb.QueryReply(code=0, value=q.value, height=height, proof=proof)


def is_light_block(path: str) -> bool:
    return path.startswith(LIGHT_BLOCK_PATH)


def light_block_reply(blocks, validators_at: Callable[[int], ValidatorSet], committed_height: int,
                      path: str) -> pb.QueryReply:
    """The light block of the height in `path` (`/light_block/<h>`): its header, its commit
    and the committee that signed it, what a light client needs to follow a committee change
    (gentorrent.ledger.light_client.Committee.follow). Anything not certified is not served."""
    arg = path[len(LIGHT_BLOCK_PATH):]
    if not (arg.isascii() and arg.isdigit() and len(arg) <= 19) or not 1 <= int(arg) <= committed_height:
        return pb.QueryReply(code=CODE_NO_BLOCK, log=f"{LIGHT_BLOCK_PATH}<height> needs a committed height "
                                                     f"1..{committed_height}, not {arg[:24]!r}")
    height = int(arg)
    raw = blocks.load_raw(height)
    if raw is None:
        return pb.QueryReply(code=CODE_NOT_YET, log=f"block {height} is not stored with its commit yet; retry")
    block = LightBlock(Block.decode(raw[0]).header, Commit.decode(raw[1]), validators_at(height))
    return pb.QueryReply(code=0, value=LightBlockCodec.encode(block), height=height)
