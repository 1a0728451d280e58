"""The committee's model catalogue: a model is its name plus its weights' digest; a member adds
one by a signed transaction with the engine options to run it with; a node registering a listed
name must give a listed digest. The real RegistryApp, driven block by block (no processes), and
`gt-verifier catalogue` with `gt-model`'s registration against a running committee of one."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gentorrent import weights
from gentorrent.crypto.keys import Identity, OnionKey
from gentorrent.crypto.tls import make_self_signed
from gentorrent.ledger import catalogue, txs
from gentorrent.ledger.genesis import Genesis, GenesisError, GenesisValidator
from gentorrent.ledger.sections import LOCAL_MODELS, decode_models
from verifier.abci.app import RegistryApp
from verifier.abci.interface import BlockContext, ValidatorInfo

CHAIN = "catalogue-test"
T0 = 1_700_000_000_000
MEMBER = Identity.from_seed(bytes([1]) * 32)
DIGEST_A, DIGEST_B = "sha256:" + "a" * 64, "sha256:" + "b" * 64
ROOT = Path(__file__).resolve().parents[1]


class Chain:
    def __init__(self, path, app_state: dict | None = None) -> None:
        self.app = RegistryApp(path)
        self.app.init_chain(CHAIN, [ValidatorInfo(MEMBER.public_key, 1)], json.dumps(app_state or {}).encode(), T0)
        self.height, self.seqs = 0, {}

    def seq(self, identity: Identity) -> int:
        self.seqs[identity.public_key] = self.seqs.get(identity.public_key, 0) + 1
        return self.seqs[identity.public_key]

    def block(self, *raw: bytes) -> list[int]:
        self.height += 1
        res = self.app.finalize_block(list(raw), BlockContext(self.height, T0 + 1000 * self.height,
                                                              MEMBER.public_key, bytes(32)))
        self.app.commit()
        return [r.code for r in res.tx_results]

    def add(self, signer: Identity, **fields) -> bytes:
        entry = catalogue.entry_of({"model": "llama-q4", "weights_digest": DIGEST_A, **fields})
        return txs.catalogue_add(signer, entry, self.seq(signer), chain_id=CHAIN)

    def register(self, node: Identity, model: str, digest: str, kind: str = "register_model") -> bytes:
        return getattr(txs, kind)(node, f"127.0.0.1:{9000 + node.public_key[0] % 100}", model, 5,
                                  self.seq(node), OnionKey.generate().public_key,
                                  chain_id=CHAIN, weights_digest=digest)

    def listed(self) -> list[dict]:
        return json.loads(self.app.query("/catalogue").value)


@pytest.fixture
def chain(tmp_path):
    c = Chain(tmp_path / "app.db")
    yield c
    c.app.close()


def test_a_member_lists_a_model_with_its_engine_options_and_nobody_else_can(chain):
    outsider = Identity.from_seed(bytes([9]) * 32)
    hash0 = chain.app.info().last_block_app_hash
    assert chain.block(chain.add(outsider)) == [txs.CODE_UNAUTHORIZED]
    assert chain.listed() == []
    assert chain.block(chain.add(MEMBER, quantization="awq", dtype="float16", kv_cache_dtype="fp8",
                                 max_model_len=4096)) == [txs.CODE_OK]
    [entry] = chain.listed()
    assert (entry["model"], entry["weights_digest"], entry["quantization"], entry["dtype"], entry["kv_cache_dtype"],
            entry["max_model_len"], entry["added_height"]) == ("llama-q4", DIGEST_A, "awq", "float16", "fp8", 4096, 2)
    assert chain.block(chain.add(MEMBER)) == [txs.CODE_INVALID_FIELD]  # listed once
    assert chain.app.info().last_block_app_hash != hash0  # the app hash covers the catalogue


def test_a_listed_model_registers_only_with_a_listed_digest(chain):
    chain.block(chain.add(MEMBER), chain.add(MEMBER, weights_digest=DIGEST_B))
    node, other, free = (Identity.from_seed(bytes([s]) * 32) for s in (20, 21, 22))
    assert chain.block(chain.register(node, "llama-q4", "sha256:" + "c" * 64)) == [txs.CODE_NOT_LISTED]
    assert chain.block(chain.register(other, "llama-q4", "")) == [txs.CODE_NOT_LISTED]
    assert chain.block(chain.register(node, "llama-q4", DIGEST_B)) == [txs.CODE_OK]
    assert chain.block(chain.register(node, "llama-q4", "sha256:" + "c" * 64, "update_model")) == \
        [txs.CODE_NOT_LISTED]  # nor move to other weights later
    assert chain.block(chain.register(free, "unlisted-model", "")) == [txs.CODE_OK]  # a name nobody lists
    models = {m.node_id: m for m in decode_models(chain.app.query(LOCAL_MODELS).value)}
    assert models[node.node_id].weights_digest == DIGEST_B and models[free.node_id].weights_digest == ""


def test_the_genesis_lists_models_and_the_catalogue_survives_a_restart(tmp_path):
    entry = {"model": "smollm2-135m", "weights_digest": DIGEST_A, "dtype": "float32"}
    c = Chain(tmp_path / "app.db", {"catalogue": [entry]})
    assert [(e["model"], e["added_height"]) for e in c.listed()] == [("smollm2-135m", 0)]
    c.block(c.add(MEMBER))
    app_hash = c.app.info().last_block_app_hash
    c.app.close()
    again = RegistryApp(tmp_path / "app.db")  # the store recomputes the app hash from its rows
    assert again.info().last_block_app_hash == app_hash
    assert [e["model"] for e in json.loads(again.query("/catalogue").value)] == ["smollm2-135m", "llama-q4"]
    again.close()
    validator = GenesisValidator("v0", MEMBER.public_key, 1, "127.0.0.1:1", make_self_signed(MEMBER).cert_pem)
    for bad in ([{"model": "x", "weights_digest": "md5:1"}], [entry, entry], [{"model": "x", "weights_digest": DIGEST_A,
                                                                                "dtype": "int3"}], {"x": 1}):
        with pytest.raises(GenesisError):
            Genesis(CHAIN, T0, (validator,), {"catalogue": bad})


def test_entries_and_digests_are_checked_before_they_are_signed():
    for fields, words in (({"model": "", "weights_digest": DIGEST_A}, "model"),
                          ({"model": "m", "weights_digest": "sha256:XYZ"}, "64 lower-case hex"),
                          ({"model": "m", "weights_digest": DIGEST_A, "quantization": "AWQ!"}, "quantization"),
                          ({"model": "m", "weights_digest": DIGEST_A, "max_model_len": 1 << 22}, "max_model_len"),
                          ({"model": "m", "weights_digest": DIGEST_A, "color": "red"}, "unknown")):
        with pytest.raises(txs.TxError, match=words):
            catalogue.entry_of(fields)
    node = Identity.from_seed(bytes([5]) * 32)
    with pytest.raises(txs.TxError, match="weights_digest"):
        txs.register_model(node, "127.0.0.1:9", "m", 5, 1, chain_id=CHAIN, weights_digest="sha256:short")


# --------------------------------------------------------------------------- with processes


def _cli(module: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT)


@pytest.mark.network
@pytest.mark.timeout(240)
async def test_gt_verifier_catalogue_add_lists_a_checkpoint_and_a_node_registers_it_by_its_digest(tmp_path):
    """The transaction and the registration path, cheaply: a committee of one, a checkpoint
    folder (its digest computed by `gt-verifier catalogue add --weights`), and a model node's
    registration (the echo stand-in registers as `gt-model serve` does, with the digest of
    `--weights`) refused with other weights and accepted with these."""
    from gentorrent.ledger.committee import CommitteeDirectory, RegistrationError
    from testkit.committee import free_base_port
    from testkit.echo_model import EchoModelNode

    out = _cli("verifier.cli", "init", "--validators", "1", "--out", str(tmp_path / "c"), "--timeouts", "fast",
               "--base-port", str(free_base_port(1)))
    assert out.returncode == 0, out.stderr
    home = tmp_path / "c" / "v0"
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text('{"max_position_embeddings": 2048}')
    (ckpt / "model.safetensors").write_bytes(os.urandom(4096))
    verifier = await asyncio.create_subprocess_exec(sys.executable, "-m", "verifier.cli", "start", "--home", str(home),
                                                    cwd=ROOT, stdout=asyncio.subprocess.PIPE,
                                                    stderr=asyncio.subprocess.DEVNULL)
    try:
        await asyncio.wait_for(verifier.stdout.readline(), 60)
        added = await asyncio.to_thread(_cli, "verifier.cli", "catalogue", "add", "--home", str(home), "--model",
                                        "my-model", "--weights", str(ckpt), "--quantization", "fp8")
        assert added.returncode == 0, added.stderr
        entry = json.loads(added.stdout)
        assert entry["weights_digest"] == weights.weights_digest(ckpt) and entry["quantization"] == "fp8"
        listed = await asyncio.to_thread(_cli, "verifier.cli", "catalogue", "list", "--home", str(home))
        assert [e["model"] for e in json.loads(listed.stdout)] == ["my-model"]
        for digest, ok in (("sha256:" + "0" * 64, False), (entry["weights_digest"], True)):
            node_home = tmp_path / ("right" if ok else "wrong")
            directory = CommitteeDirectory.from_args(str(home / "genesis.json"), node_home)  # the node's own keys
            model = EchoModelNode(node_home, directory, model="my-model")
            model.weights_digest = digest
            try:
                if ok:
                    await model.start()
                    assert directory.models()[0].weights_digest == digest
                else:
                    with pytest.raises(RegistrationError, match="catalogue lists my-model with other weights"):
                        await model.start()
            finally:
                await model.stop()
        # gt-model reads the catalogue before its engine loads: other weights under the name stop it there
        other = tmp_path / "other"
        other.mkdir()
        (other / "config.json").write_text('{"max_position_embeddings": 2048}')
        (other / "model.safetensors").write_bytes(os.urandom(4096))
        served = await asyncio.to_thread(_cli, "model_node.cli", "serve", "--home", str(tmp_path / "m"), "--model",
                                         "my-model", "--weights", str(other), "--listen", "127.0.0.1:0",
                                         "--committee", str(home / "genesis.json"), "--no-metrics", timeout=180)
        assert served.returncode == 3, served.stderr[-2000:]
        assert "catalogue lists my-model with other weights" in served.stderr and "[2/3]" not in served.stderr
    finally:
        verifier.terminate()
        await asyncio.wait_for(verifier.wait(), 30)
