"""The committee's rules read their numbers from the chain (the genesis), never from a member.

The attack, or the accident: two verifiers whose own defaults differ (another build, a
deployment that edited gentorrent/config.py) applied the same blocks and computed different
states, because the replicated rules read process-local settings (EPOCHS.score_tolerance and
max_probed_nodes in the epoch rules, EPOCH_RUN's phase deadlines, REPUTATION's update, the
capacity bounds of a registration): the committee forks on the first epoch. Now every such
number is a genesis parameter stored in the state (gentorrent/ledger/chain_params.py).
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from gentorrent.config import EPOCHS
from gentorrent.crypto.keys import Identity
from gentorrent.crypto.tls import make_self_signed
from gentorrent.ledger import epoch_txs, txs
from gentorrent.ledger.chain_params import ChainParams, ChainParamsError, RegistryRules
from gentorrent.ledger.genesis import Genesis, GenesisError, GenesisValidator
from gentorrent.traffic.model import ChatRequest
from gentorrent.wire import gentorrent_pb2 as pb
from verifier.abci.app import RegistryApp
from verifier.abci.interface import BlockContext, ValidatorInfo
from verifier.epochs import vrf
from verifier.epochs.challenges import commit_request
from verifier.epochs.probe_format import vrf_public_of, vrf_secret_of

ROOT = Path(__file__).resolve().parents[1]
CHAIN = "params-test"
T0 = 1_700_000_000_000
MEMBERS = [Identity.from_seed(bytes([210 + i]) * 32) for i in range(4)]
MODELS = [Identity.from_seed(bytes([70 + i]) * 32) for i in range(3)]
#: a second verifier's own defaults: every number the rules used to read from the process
OTHER_DEFAULTS = {
    "EPOCHS": {"score_tolerance": 0.01, "max_probed_nodes": 2, "plan_timeout_ms": 500_000},
    "EPOCH_RUN": {"plan_timeout_ms": 500_000, "history_kept": 1},
    "REPUTATION": {"alpha": 0.5, "beta": 0.5, "initial_reputation": 0.9},
    "MODEL_NODE": {"max_capacity": 4},
}


class Recorder:
    """A registry app driven block by block whose blocks are written down for replay."""

    def __init__(self, path: Path, app_state: dict) -> None:
        self.app = RegistryApp(path)
        self.app_state = app_state
        validators = [ValidatorInfo(m.public_key, 1) for m in MEMBERS]
        state = json.dumps(app_state, sort_keys=True, separators=(",", ":")).encode()
        self.hashes = [self.app.init_chain(CHAIN, validators, state, T0).hex()]
        self.blocks: list[dict] = []
        self.time_ms, self.seq = T0, {}

    def next_seq(self, ident: Identity) -> int:
        self.seq[ident.public_key] = self.seq.get(ident.public_key, 0) + 1
        return self.seq[ident.public_key]

    def block(self, block_txs: list[bytes], dt_ms: int = 1000) -> list[int]:
        height = len(self.blocks) + 1
        self.time_ms += dt_ms
        ctx = BlockContext(height, self.time_ms, MEMBERS[0].public_key, bytes([height]) * 32)
        result = self.app.finalize_block(block_txs, ctx)
        self.app.commit()
        self.blocks.append({"height": height, "time_ms": self.time_ms, "proposer": MEMBERS[0].public_key.hex(),
                            "hash": ctx.hash.hex(), "txs": [t.hex() for t in block_txs]})
        self.hashes.append(result.app_hash.hex())
        return [r.code for r in result.tx_results]

    @property
    def section(self) -> pb.EpochsSection:
        return pb.EpochsSection.FromString(self.app.query("/epochs").value)

    def leader(self) -> Identity:
        return next(m for m in MEMBERS if m.public_key == self.section.current.leader)

    def dump(self, path: Path) -> None:
        path.write_text(json.dumps({"chain_id": CHAIN, "genesis_time_ms": T0, "app_state": self.app_state,
                                    "validators": [[m.public_key.hex(), 1] for m in MEMBERS],
                                    "blocks": self.blocks}))


def record_a_chain(tmp_path: Path) -> Recorder:
    """Registrations, one attested epoch whose scores spread by up to 0.03, and an epoch whose
    leader plans nothing for 400 s: every rule a process-local number reached before."""
    rec = Recorder(tmp_path / "recorder.sqlite", ChainParams().to_app_state())  # as gt-verifier init writes it
    assert rec.block([txs.register_model(m, f"127.0.0.1:{9000 + i}", "smollm2-135m", 5,
                                         1, chain_id=CHAIN) for i, m in enumerate(MODELS)]) == [0, 0, 0]
    assert rec.block([epoch_txs.member_keys(m, vrf_public_of(m), bytes([7]) * 32, rec.next_seq(m), chain_id=CHAIN)
                      for m in MEMBERS]) == [0] * 4
    seed = rec.section.current.seed
    assert rec.block([epoch_txs.vrf_proof(m, 1, vrf.prove_leadership(vrf_secret_of(m), CHAIN, 1, seed),
                                          rec.next_seq(m), chain_id=CHAIN) for m in MEMBERS]) == [0] * 4
    leader = rec.leader()
    plan = [(m.node_id, commit_request(bytes([i]) * 32, ChatRequest.question(f"Question {i}?")))
            for i, m in enumerate(MODELS)]
    assert rec.block([epoch_txs.plan(leader, 1, plan, rec.next_seq(leader), chain_id=CHAIN)]) == [0]
    public = [pb.ProbeReply(node_id=m.node_id, digest=bytes([i + 1]) * 32) for i, m in enumerate(MODELS)]
    assert rec.block([epoch_txs.replies(leader, 1, public, rec.next_seq(leader), chain_id=CHAIN)]) == [0]
    scores = [(990_000, 100_000, 600_000), (995_000, 110_000, 610_000), (965_000, 90_000, 640_000)]
    assert rec.block([epoch_txs.attestation(m, 1, [(n.node_id, s, 0) for n, s in zip(MODELS, row)],
                                            rec.next_seq(m), chain_id=CHAIN)
                      for m, row in zip(MEMBERS, scores)]) == [0, 0, 0]
    assert rec.section.history[-1].phase == "done" and rec.section.epoch == 2
    rec.block([], dt_ms=EPOCHS.election_timeout_ms)  # epoch 2 elects at its deadline
    rec.block([], dt_ms=400_000)  # its leader plans nothing: past the genesis' plan deadline (300 s)
    assert rec.section.history[-1].faulty_leader and rec.section.epoch == 3
    return rec


def _replay(chain: Path, overrides: dict, where: Path) -> list[str]:
    where.mkdir()
    (where / "overrides.json").write_text(json.dumps(overrides))
    out = subprocess.run([sys.executable, "-m", "testkit.replay", str(chain), str(where / "overrides.json")],
                         capture_output=True, text=True, timeout=120, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout)


def test_two_verifiers_with_different_local_settings_compute_the_same_app_hashes(tmp_path):
    """Two real processes replay the same blocks from the same genesis; the second one's own
    defaults differ in every number the rules used to read from the process. On the old rules
    the hashes part at the first epoch's result (tolerance, probe set, reputation) and the
    registrations (capacity bounds)."""
    rec = record_a_chain(tmp_path)
    rec.dump(tmp_path / "chain.json")
    mine = _replay(tmp_path / "chain.json", {}, tmp_path / "a")
    other = _replay(tmp_path / "chain.json", OTHER_DEFAULTS, tmp_path / "b")
    assert mine == rec.hashes
    assert other == mine, [i for i, (a, b) in enumerate(zip(mine, other)) if a != b][:1]


def test_the_parameters_are_the_genesis_and_travel_in_the_state(tmp_path):
    params = ChainParams(registry=replace(RegistryRules.production(60), relays_per_24=9),
                         epochs=replace(EPOCHS, score_tolerance=0.2, max_probed_nodes=7))
    assert ChainParams.from_app_state(params.to_app_state()) == params
    assert ChainParams.decode(params.encode()) == params
    rec = Recorder(tmp_path / "a.sqlite", params.to_app_state())
    assert ChainParams.decode(rec.app.query("/params").value) == params
    rec.app.close()
    again = RegistryApp(tmp_path / "a.sqlite")  # from the store: the app hash covers them
    assert ChainParams.decode(again.query("/params").value) == params
    again.close()
    assert ChainParams.from_app_state({}) == ChainParams()  # absent: the dataclasses' defaults


@pytest.mark.parametrize("app_state,says", [
    ({"epochs": {"score_tolerance": 2.0}}, "score_tolerance must be in [0, 1]"),
    ({"epochs": {"max_probed_nodes": 10_000}}, "max_probed_nodes must be in 0..512"),
    ({"epochs": {"plan_timeout_ms": 0}}, "must be > 0"),
    ({"epochs": {"score_tolerence": 0.1}}, "unknown key (did you mean 'score_tolerance'?)"),
    ({"reputation": {"alpha": "0.4"}}, "expected float, got str"),
    ({"reputation": {"window": 0}}, "window must be >= 1"),
    ({"scoring": {}}, "unknown section(s) ['scoring']"),
    ({"registry": {"lease_s": 1}}, "lease_s must be a number of seconds"),
    ({"registry": {"pow_bits": 41}}, "pow_bits must be an integer in 0..40"),
    ({"registry": {"relays_per_24": -1}}, "relays_per_24 must be an integer"),
    ({"registry": {"distinct_path_prefixes": 1}}, "distinct_path_prefixes must be true or false"),
    ({"registry": {"pow_memory_kib": 4}}, "memory_kib 8..1048576"),
    ({"registry": {"lease": 60}}, "app_state.registry must be an object with at most the keys"),
])
def test_a_bad_parameter_stops_the_genesis_with_a_clear_error(app_state, says):
    with pytest.raises(ChainParamsError) as err:
        ChainParams.from_app_state(app_state)
    assert says in str(err.value)
    member = GenesisValidator("v0", MEMBERS[0].public_key, 1, "127.0.0.1:1", make_self_signed(MEMBERS[0]).cert_pem)
    with pytest.raises(GenesisError):
        Genesis(CHAIN, T0, (member,), app_state)


def test_gt_verifier_init_writes_every_parameter_into_the_genesis(tmp_path):
    from verifier import cli

    assert cli.main(["--log-level", "WARNING", "init", "--validators", "1", "--out", str(tmp_path), "--base-port",
                     "26900", "--lease-s", "60"]) == 0
    app_state = json.loads((tmp_path / "v0" / "genesis.json").read_text())["app_state"]
    # on loopback: the devnet's registry rules (a light proof of work, no prefix rules)
    assert app_state == ChainParams(registry=RegistryRules.loopback(60)).to_app_state()
    assert app_state["registry"]["pow_bits"] > 0 and not app_state["registry"]["distinct_path_prefixes"]
    assert set(app_state["epochs"]) >= {"max_probed_nodes", "score_tolerance", "plan_timeout_ms"}


@pytest.mark.parametrize("extra,rules", [((), RegistryRules.production()),
                                         (("--registry", "devnet"), RegistryRules.loopback())])
def test_gt_verifier_init_writes_the_production_registry_rules_off_loopback(tmp_path, extra, rules):
    """Members on other hosts get the production Sybil rules (proof of work, prefix caps, one relay
    per /16 on a path) unless the operator asks for the devnet's (the WAN devnet does)."""
    from verifier import cli

    assert cli.main(["--log-level", "WARNING", "init", "--validators", "2", "--out", str(tmp_path), "--base-port",
                     "26900", "--hosts", "10.1.0.1,10.2.0.1", *extra]) == 0
    genesis = Genesis.load(tmp_path / "v0" / "genesis.json")
    assert genesis.rules == rules == genesis.params.registry


#: the modules of the replicated rules: what they may take from gentorrent.config
REPLICATED = ["verifier/abci/state.py", "verifier/abci/app.py", "verifier/abci/store.py", "verifier/epochs/machine.py",
              "gentorrent/ledger/txs.py", "gentorrent/ledger/epoch_txs.py", "gentorrent/ledger/signed_tx.py",
              "gentorrent/ledger/sections.py", "gentorrent/ledger/chain_params.py"]


@pytest.mark.parametrize("path", REPLICATED)
def test_the_replicated_rules_import_no_process_setting(path):
    """Only protocol limits (WIRE, the MAX_/MIN_ constants) and dataclass types, never a settings
    singleton that a node's defaults could make differ."""
    tree = ast.parse((ROOT / path).read_text())
    names = [a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module == "gentorrent.config"
             for a in n.names]
    settings = [n for n in names if n.isupper() and n != "WIRE" and not n.startswith(("MAX_", "MIN_"))]
    assert not settings, f"{path} reads {settings}"
