"""Shared pytest fixtures. Helpers add fixtures for their area below with small edits."""

from __future__ import annotations

# --------------------------------------------------------------------------- model node
# ONE real `gt-model serve --model smollm2-135m` process for the whole session: every test file
# that needs a model node asks for `model_node` instead of starting its own engine (engines take
# tens of seconds to start on 2 cores). Read `address` / `cert_pem` / `public_key` when you use
# them (a restart test may move the node to a new port), or `await model_node.connect()`.

import json as _json  # noqa: E402
import os as _os  # noqa: E402
import signal as _signal  # noqa: E402
import subprocess as _subprocess  # noqa: E402
import sys as _sys  # noqa: E402
import time as _time  # noqa: E402
from pathlib import Path as _Path  # noqa: E402

import pytest  # noqa: E402

MODEL_NODE_START_TIMEOUT_S = 900.0


class ModelNodeProcess:
    """A `gt-model serve` process on 127.0.0.1 and what a client needs to reach it."""

    def __init__(self, home: _Path, model: str = "smollm2-135m", extra: tuple[str, ...] = ()) -> None:
        self.home, self.model, self.extra = home, model, extra
        self.process: _subprocess.Popen | None = None
        self.info: dict = {}

    # what clients need
    address = property(lambda self: self.info["address"])
    node_id = property(lambda self: self.info["node_id"])
    public_key = property(lambda self: bytes.fromhex(self.info["public_key"]))
    cert_pem = property(lambda self: _Path(self.info["cert_file"]).read_bytes())

    async def connect(self, timeout: float = 30.0):
        from gentorrent.crypto import tls

        return await tls.connect(self.address, self.cert_pem, timeout=timeout)

    @staticmethod
    def stub(channel):
        from gentorrent.wire import gentorrent_pb2_grpc as rpc

        return rpc.ModelNodeStub(channel)

    def start(self, timeout: float = MODEL_NODE_START_TIMEOUT_S) -> "ModelNodeProcess":
        """Start `gt-model serve`, wait until its node.json appears (or it dies)."""
        self.home.mkdir(parents=True, exist_ok=True)
        out = self.home / "serve.out"
        with open(out, "ab") as log:
            self.process = _subprocess.Popen(
                [_sys.executable, "-m", "model_node.cli", "serve", "--model", self.model,
                 "--home", str(self.home), "--listen", "127.0.0.1:0", "--stop-with-parent", *self.extra],
                stdout=log, stderr=_subprocess.STDOUT, start_new_session=True,
            )
        state = self.home / "node.json"
        deadline = _time.monotonic() + timeout
        while not state.exists():
            if self.process.poll() is not None:
                tail = out.read_bytes()[-3000:].decode(errors="replace")
                raise RuntimeError(f"gt-model serve exited with {self.process.returncode}:\n{tail}")
            if _time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"gt-model serve not ready after {timeout:.0f} s")
            _time.sleep(0.5)
        self.info = _json.loads(state.read_text())
        return self

    def stop(self, sig: int = _signal.SIGTERM, timeout: float = 60.0) -> int | None:
        """Signal it (clean shutdown), SIGKILL its process group if it hangs; exit code."""
        proc = self.process
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(sig)
            try:
                proc.wait(timeout)
            except _subprocess.TimeoutExpired:
                _os.killpg(proc.pid, _signal.SIGKILL)
                proc.wait(10)
        return proc.returncode


@pytest.fixture(scope="session")
def model_node(tmp_path_factory) -> ModelNodeProcess:
    node = ModelNodeProcess(tmp_path_factory.mktemp("model-node")).start()
    try:
        yield node
    finally:
        node.stop()


# --------------------------------------------------------------------------- one worker for engines
# `make test` runs on two pytest-xdist workers (`--dist loadgroup`). Every test that starts a
# vLLM engine or uses the session's model node goes to ONE worker, in file order: engines
# are what a 2-core machine cannot run two of at once without timing out epochs, a second
# worker would start a second session engine, and test_model_node's restart test must stay
# after the tests that share the node. Everything else runs on the other worker meanwhile.
# The tests that wait for verification epochs go last: a busy machine can push their epochs
# past the deadlines, and there they share the machine with the other worker the least (it
# finished during the devnet test in the runs measured; README "Development").

ENGINE_GROUP = "engines"
EPOCH_WAITING_FILES = ("test_epochs_live.py", "test_devnet.py")


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the groups
def pytest_collection_modifyitems(config, items) -> None:
    for item in items:
        if item.get_closest_marker("engine") or "model_node" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group(ENGINE_GROUP))
    items.sort(key=lambda item: item.get_closest_marker("engine") is not None
               and item.path.name in EPOCH_WAITING_FILES)


@pytest.fixture(autouse=True)
def _engine_tests_grouped(request) -> None:
    """Fail loudly where the grouping does not take (pytest 9.2 with xdist 3.8 drops it
    silently, pytest-dev/pytest-xdist#1386): two engine tests at once time out on 2 cores."""
    item = request.node
    if getattr(request.config.option, "loadgroup", False) and item.get_closest_marker("xdist_group") \
            and not item.nodeid.endswith(f"@{ENGINE_GROUP}"):
        pytest.fail("--dist loadgroup did not keep the engine tests on one worker: use the pytest and "
                    "pytest-xdist versions pyproject.toml names", pytrace=False)
