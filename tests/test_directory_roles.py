"""Every role through the proven queries, end to end in one process: four real verifier nodes
(consensus over gRPC/TLS), an echo model node and six user nodes that register themselves through
CommitteeDirectory (with the loopback genesis' proof of work), build paths from a relay sample
drawn at their own indices, and ask through the overlay: proxies look the model node up by id,
the model node its proxies, relays their callers; nobody holds the whole registry."""

from __future__ import annotations

import contextlib
import io

import pytest

from gentorrent.config import CloveParams, OverlayParams
from gentorrent.ledger.committee import CommitteeDirectory
from testkit.committee import free_base_port
from testkit.echo_model import ECHO_PREFIX, EchoModelNode
from user_client.node import UserNode
from verifier import cli
from verifier.node import VerifierNode

pytestmark = [pytest.mark.network, pytest.mark.timeout(180)]
CLOVES = CloveParams(n=4, k=3, path_length=3, proxies_kept=4)
FAST = OverlayParams(first_reply_timeout_s=8.0, reply_idle_timeout_s=15.0, forward_timeout_s=5.0,
                     establish_timeout_s=5.0, maintenance_interval_s=1.0, build_attempts=12)


async def test_every_role_works_from_proven_answers_alone(tmp_path):
    with contextlib.redirect_stdout(io.StringIO()):
        assert cli.main(["--log-level", "WARNING", "init", "--validators", "4", "--out", str(tmp_path / "c"),
                         "--base-port", str(free_base_port(4)), "--timeouts", "fast", "--chain-id", "roles",
                         "--lease-s", "60"]) == 0
    genesis = str(tmp_path / "c" / "v0" / "genesis.json")
    verifiers = [VerifierNode(tmp_path / "c" / f"v{i}") for i in range(4)]
    started = []
    try:
        for v in verifiers:
            await v.start()
            started.append(v)
        model = EchoModelNode(tmp_path / "model", CommitteeDirectory.from_args(genesis, tmp_path / "model"),
                              cloves=CLOVES, params=FAST)
        await model.start()
        started.append(model)
        users = [UserNode(tmp_path / f"u{i}", CommitteeDirectory.from_args(genesis, tmp_path / f"u{i}"),
                          cloves=CLOVES, params=FAST, maintain=False) for i in range(6)]
        for u in users:
            await u.start(build_paths=False)
            started.append(u)
        for u in users:
            await u.refresh_directory()
        me = users[0]
        assert me.directory.models() == []  # nothing followed before it asks
        assert await me.paths.fill() >= CLOVES.n
        for i in range(3):
            answer = await me.ask(f"hello {i}", model=model.model)
            assert answer.served_by == model.keys.identity.node_id_hex and answer.text.startswith(ECHO_PREFIX)
        assert [m.node_id for m in me.directory.models()] == [model.keys.identity.node_id]  # the roster it asked
        # the model node learnt its proxies by looking each up: they are all registered users
        known = set(model.intake.index._by_id)
        assert known and known <= {u.node_id_hex for u in users}
    finally:
        for node in reversed(started):
            await node.stop()
