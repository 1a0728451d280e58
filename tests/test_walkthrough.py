"""The README's "Running GenTorrent across machines", command for command, on 127.0.0.1.

The commands are read out of README.md itself (its `sh` blocks in that section), so the
walk-through and this test cannot drift apart: change a command there and this test runs the
new one. Each "machine" is a folder of its own with its own HOME; the only file copied
between machines is the committee's `genesis.json` (and, as the README says, each member's
home from the machine that ran `gt-verifier init`). No devnet code runs: every node is the
`gt-verifier` / `gt-model` / `gt-user` command of the README, started as its own process.

What one machine changes, and nothing else:
- every public host (`0.0.0.0`, `*.example.org`) becomes 127.0.0.1, and every port a free
  one below the kernel's ephemeral range (the same port on one machine stays the same port, so `--listen` and `--advertise` agree);
- `/var/lib/gentorrent` and `~` live in the machine's folder;
- the README shows member v0; members v1..v3 run the same command with their own home and
  ports, and share v0's reference engine (ARCHITECTURE.md §4: on one machine the members share
  one, as the devnet does).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gentorrent.config import CLOVES, OVERLAY
from testkit.committee import free_base_port

pytestmark = [pytest.mark.engine, pytest.mark.network, pytest.mark.timeout(1200)]

ROOT = Path(__file__).resolve().parents[1]
SECTION = "## Running GenTorrent across machines"
BIN = Path(sys.executable).parent
START_TIMEOUT_S = 900.0
MEMBERS = 4


# --------------------------------------------------------------------------- the README's commands


def readme_commands(readme: Path = ROOT / "README.md") -> list[list[str]]:
    """argv of every command in the `sh` blocks of the section, in order (continuations
    joined, comments dropped)."""
    text = readme.read_text()
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    section = text[start:end if end > 0 else None]
    commands = []
    for block in re.findall(r"```sh\n(.*?)```", section, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            argv = shlex.split(line, comments=True)
            if argv:
                commands.append(argv)
    return commands


def role(argv: list[str]) -> str:
    """Which step of the walk-through a command is."""
    head = tuple(argv[:2])
    if head == ("gt-model", "serve"):
        return "model" if "--committee" in argv else "reference"
    return {("gt-verifier", "init"): "init", ("gt-verifier", "start"): "verifier",
            ("gt-user", "start"): "user", ("gt-user", "ask"): "ask"}.get(head, "unknown")


def test_the_readme_walkthrough_has_every_step():
    """Cheap, and first: the section still has the shape the test below follows."""
    roles = [role(argv) for argv in readme_commands()]
    assert roles == ["init", "reference", "verifier", "model", "user", "ask"], roles
    for argv in readme_commands():
        if role(argv) in ("model", "user"):
            assert "--committee" in argv and "--advertise" in argv, argv  # they listen on 0.0.0.0


# --------------------------------------------------------------------------- one machine per role


class Machines:
    """Folders standing for machines, and the rewriting of a README command for one of them."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.committee_base = free_base_port(MEMBERS)
        self.readme_base = 0  # the README's --base-port
        self._ports: dict[tuple[str, int], int] = {}
        self.procs: dict[str, subprocess.Popen] = {}
        self.t0 = time.monotonic()  # the waits print when they ended: where the time goes

    def path(self, machine: str) -> Path:
        p = self.root / machine
        (p / "home").mkdir(parents=True, exist_ok=True)
        return p

    def port(self, machine: str, port: int) -> int:
        if self.readme_base and self.readme_base <= port < self.readme_base + MEMBERS:
            return self.committee_base + port - self.readme_base  # the committee's, everywhere
        while (machine, port) not in self._ports:
            # below the ephemeral range: a port chosen now is bound minutes later (after the
            # reference engine), and an outgoing connection took one in between (CI, a dashboard's)
            chosen = free_base_port(1)
            taken = set(self._ports.values()) | set(range(self.committee_base, self.committee_base + MEMBERS))
            if chosen not in taken:
                self._ports[(machine, port)] = chosen
        return self._ports[(machine, port)]

    def localize(self, argv: list[str], machine: str, shared: dict[str, str] | None = None) -> list[str]:
        """`argv` as it runs on `machine`; `shared` maps an option to the machine whose value
        it keeps (the members' shared reference engine)."""
        out = []
        owner = machine
        for i, arg in enumerate(argv):
            owner = (shared or {}).get(argv[i - 1], machine) if i else machine
            if argv[i - 1:i] == ["--base-port"]:
                self.readme_base = self.readme_base or int(arg)
                out.append(str(self.committee_base))
                continue
            arg = re.sub(r"^(0\.0\.0\.0|[a-z0-9-]+\.example\.org)(?=:\d+$)", "127.0.0.1", arg)
            if arg == "0.0.0.0":
                arg = "127.0.0.1"
            arg = re.sub(r"^(127\.0\.0\.1):(\d+)$", lambda m: f"{m[1]}:{self.port(owner, int(m[2]))}", arg)
            arg = arg.replace("/var/lib/gentorrent", str(self.path(owner) / "var/lib/gentorrent"))
            if arg.startswith("~/"):
                arg = str(self.path(owner) / "home" / arg[2:])
            out.append(arg)
        return out

    def env(self, machine: str) -> dict[str, str]:
        return {**os.environ, "HOME": str(self.path(machine) / "home"), "PATH": f"{BIN}:{os.environ['PATH']}",
                "VLLM_CPU_KVCACHE_SPACE": "1"}

    def run(self, machine: str, argv: list[str], timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run(argv, cwd=self.path(machine), env=self.env(machine), capture_output=True, text=True,
                              timeout=timeout)

    def start(self, name: str, machine: str, argv: list[str]) -> None:
        log = open(self.root / f"{name}.log", "wb")
        self.procs[name] = subprocess.Popen(argv, cwd=self.path(machine), env=self.env(machine), stdout=log,
                                            stderr=subprocess.STDOUT, start_new_session=True)

    def check_alive(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                tail = (self.root / f"{name}.log").read_bytes()[-3000:].decode(errors="replace")
                raise AssertionError(f"{name} exited with {proc.returncode}:\n{tail}")

    def wait(self, what: str, check, timeout_s: float = START_TIMEOUT_S) -> None:
        start = time.monotonic()
        deadline = start + timeout_s
        while not check():
            self.check_alive()
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(1.0)
        print(f"{time.monotonic() - self.t0:6.0f} s  {what} (waited {time.monotonic() - start:.0f} s)")

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)


def _member(argv: list[str], n: int) -> list[str]:
    """Member n's copy of the README's member-v0 command (its own home and public name)."""
    return [re.sub(r"/var/lib/gentorrent/v0$", f"/var/lib/gentorrent/v{n}",
                   a.replace("v0.example.org", f"v{n}.example.org")) for a in argv]


def _json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def test_the_readme_walkthrough_on_one_machine(tmp_path):
    steps = {role(argv): argv for argv in readme_commands()}
    m = Machines(tmp_path / "machines")
    try:
        # 1. the committee: homes and genesis on one machine, each home to its member's machine
        out = m.run("admin", m.localize(steps["init"], "admin"))
        assert out.returncode == 0, out.stderr
        made = m.path("admin") / "committee"
        genesis = json.loads((made / "v0" / "genesis.json").read_text())
        assert [v["address"] for v in genesis["validators"]] == \
            [f"127.0.0.1:{m.committee_base + i}" for i in range(MEMBERS)]  # no edit needed on one machine
        machines = [f"v{i}" for i in range(MEMBERS)] + ["m0", "u1"]
        for name in machines:
            shutil.copy(made / "v0" / "genesis.json", m.path(name) / "genesis.json")  # the one shared file
        for i in range(MEMBERS):
            shutil.copytree(made / f"v{i}", m.path(f"v{i}") / f"var/lib/gentorrent/v{i}")

        # each member's reference engine (v0's, shared) and the members themselves
        m.start("reference", "v0", m.localize(steps["reference"], "v0"))
        reference_home = m.path("v0") / "var/lib/gentorrent/v0-reference"
        m.wait("the reference engine's certificate", lambda: (reference_home / "tls.crt.pem").exists(), 300)
        shared = {"--reference-model": "v0", "--reference-cert": "v0"}
        for i in range(MEMBERS):
            m.start(f"v{i}", f"v{i}", m.localize(_member(steps["verifier"], i), f"v{i}", shared))

        # 2. a model node and 3. a user node, each registering itself
        m.start("m0", "m0", m.localize(steps["model"], "m0"))
        user_argv = m.localize(steps["user"], "u1")
        m.start("u1", "u1", user_argv)
        user_home = Path(user_argv[user_argv.index("--home") + 1])
        model_home = m.path("m0") / "var/lib/gentorrent/m0"
        m.wait("the model node to serve and register itself", lambda: (model_home / "node.json").exists())
        m.wait("the user node to register itself", lambda: (user_home / "node.json").exists())

        def paths_ready() -> bool:
            out = m.run("u1", ["gt-user", "status", "--home", str(user_home), "--json"], timeout=60)
            return out.returncode == 0 and json.loads(out.stdout)["paths"].get("usable", 0) >= CLOVES.n

        m.wait(f"the user node to hold {CLOVES.n} proxy paths (over the verifiers' probing users)", paths_ready,
               300)
        # a relay looks an unknown model node up by id; one that asked before the registration
        # was committed believes the absence for a moment (README "Known gaps"): wait that out
        registered_at = (model_home / "node.json").stat().st_mtime
        time.sleep(max(0.0, registered_at + 2 * OVERLAY.maintenance_interval_s - time.time()))

        # the README's question, as written (the user's default home is ~/.gentorrent/user)
        asked = m.run("u1", m.localize(steps["ask"], "u1"))
        assert asked.returncode == 0, asked.stderr
        answer = json.loads(m.run("u1", m.localize(steps["ask"], "u1") + ["--json"]).stdout)
        model = _json(model_home / "node.json")
        assert answer["served_by"] == model["node_id"], "not served by the node that registered itself"
        assert len(answer["paths"]) >= CLOVES.k and all(len(p) == CLOVES.path_length for p in answer["paths"])

        # the model node is in the committee's directory as it registered itself, at its advertised address
        from gentorrent.crypto.keys import NodeKeys
        from gentorrent.ledger import queries
        from gentorrent.ledger.genesis import Genesis
        from gentorrent.ledger.light_client import committee_reader
        import asyncio

        async def lookups():  # one node at a time, with proofs, as any node looks a peer up
            reader = committee_reader(Genesis.load(m.path("u1") / "genesis.json"))
            try:
                me = NodeKeys.load_or_create(m.path("u1") / "home" / ".gentorrent" / "user").identity.node_id
                return ((await reader.ask(queries.ModelLookup(bytes.fromhex(model["node_id"])))).result,
                        (await reader.ask(queries.UserLookup(me))).result)
            finally:
                await reader.close()

        record, user = asyncio.run(lookups())
        assert record is not None and record.address == model["address"] and record.registered_height > 0
        advertised = user_argv[user_argv.index("--advertise") + 1]
        assert user is not None and user.address == advertised
    finally:
        m.stop()
    assert all(p.poll() is not None for p in m.procs.values())
