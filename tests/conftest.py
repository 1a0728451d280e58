"""Shared pytest fixtures and the rules every test follows. Read this before adding a test.

Two tiers (README "Development"):

    make check   pytest --tier check: no engine, no other process, no server; under 3 minutes
    make test    pytest: the whole suite, every test, every schedule and example

Mark what a test starts (on the test, or `pytestmark = [...]` for its module):

    @pytest.mark.engine    it starts a vLLM engine (gt-model serve, a devnet). A test that uses the
                           session's `model_node` is marked for you; start no engine of your own
                           where that one would do
    @pytest.mark.network   it starts a process that runs beside it (a node, a server, anything in
                           the background: Popen, asyncio's subprocesses, a Supervisor). A
                           command run to completion (subprocess.run) is none. Mark a network
                           of nodes in this process too when it takes more than a few seconds
                           (a committee of VerifierNodes, a dozen user nodes)

The tiers cannot drift: a test that starts a background process or a vLLM engine without its
marker fails, saying which marker it needs (`_Guard` below); `make check` lists its tests that
took over CHECK_SLOW_S, for a smaller sweep there or a `network` mark. Make the
check tier cheaper, not smaller, where you can: `CHECK_TIER` is True under `--tier check`, for
a test that sweeps many seeds or schedules to sweep fewer there (make test sweeps them all).

Nothing a test starts outlives it. Every process started while a test runs carries the test's
tag in its environment (GT_TEST_TAG, also where a test passes its own `env=`); one still alive
once the test's teardown is over (after a few seconds' grace) fails that test, naming the
process, and is killed. A process a session or module fixture starts is that fixture's, and
must be gone once the fixture is finalized. Stop what you start and wait for it to exit
(`proc.wait()`, `Supervisor.stop_all()`); a `finally:` is the place.

Tests control time rather than sleep where the code takes a clock (`now_ms=`, a clock
parameter, `testkit.simnet`'s virtual time); a real sleep waits only for real processes.
"""

from __future__ import annotations

import contextlib as _contextlib  # noqa: E402
import re as _re  # noqa: E402
import threading as _threading  # noqa: E402
from typing import Callable  # noqa: E402

import psutil as _psutil  # noqa: E402

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
    """A `gt-model serve` process on 127.0.0.1 and what a client needs to reach it; with
    `dishonest=KIND`, the same code with that cheater plugged in (testkit/dishonest_model.py)."""

    def __init__(self, home: _Path, model: str = "smollm2-135m", extra: tuple[str, ...] = (),
                 dishonest: str | None = None) -> None:
        self.home, self.model, self.extra = home, model, extra
        self.command = ("model_node.cli",) if dishonest is None else ("testkit.dishonest_model", "--dishonest",
                                                                       dishonest)
        self.process: _subprocess.Popen | None = None
        self.info: dict = {}
        self.owner = ""  # the tag of what started it first (tests/conftest.py's guard)

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
        self.owner = self.owner or _os.environ.get(TAG, "")  # a restart stays its first starter's (a fixture's)
        with open(out, "ab") as log:
            self.process = _subprocess.Popen(
                [_sys.executable, "-m", *self.command, "serve", "--model", self.model,
                 "--home", str(self.home), "--listen", "127.0.0.1:0", "--stop-with-parent", *self.extra],
                stdout=log, stderr=_subprocess.STDOUT, start_new_session=True, env={**_os.environ, TAG: self.owner},
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
        if "model_node" in getattr(item, "fixturenames", ()) and not item.get_closest_marker("engine"):
            item.add_marker(pytest.mark.engine)  # the session's engine: an engine test
        if item.get_closest_marker("engine"):
            item.add_marker(pytest.mark.xdist_group(ENGINE_GROUP))
    if CHECK_TIER:  # make check: no engine, no network, a quarter of each property test's examples
        kept = [i for i in items if not any(i.get_closest_marker(m) for m in TIERED_MARKERS)]
        keep = set(kept)
        config.hook.pytest_deselected(items=[i for i in items if i not in keep])
        items[:] = kept
        for item in kept:
            _fewer_examples(getattr(item, "obj", None))
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


# --------------------------------------------------------------------------- tiers and markers

#: True under `--tier check` (make check): sweep fewer seeds and schedules there
CHECK_TIER = False
TIERED_MARKERS = ("engine", "network")  # what --tier check leaves out
CHECK_SLOW_S = 10.0  # make check names its tests slower than this
#: a module marked engine or network as a whole (`pytestmark = [...]` on one line): under
#: --tier check it is not even imported (its imports cost seconds of collection per worker)
_MODULE_MARKED = _re.compile(r"^pytestmark\s*=.*\bpytest\.mark\.(engine|network)\b", _re.M)
_slow_in_check: list[tuple[float, str]] = []


def pytest_addoption(parser) -> None:
    parser.addoption("--tier", choices=("check", "full"), default="full",
                     help="check: leave out engine and network tests and sweep fewer schedules (make check); "
                          "full: everything (make test)")


def pytest_ignore_collect(collection_path, config):
    if CHECK_TIER and collection_path.suffix == ".py" and collection_path.name.startswith("test_"):
        return True if _MODULE_MARKED.search(collection_path.read_text(errors="replace")) else None
    return None


def pytest_runtest_logreport(report) -> None:
    if CHECK_TIER and report.when == "call" and report.duration > CHECK_SLOW_S:
        _slow_in_check.append((report.duration, report.nodeid))


def pytest_terminal_summary(terminalreporter) -> None:
    if _slow_in_check:
        terminalreporter.write_sep("-", f"make check: tests over {CHECK_SLOW_S:.0f} s (sweep less under CHECK_TIER, "
                                        "or mark them network)")
        for duration, nodeid in sorted(_slow_in_check, reverse=True):
            terminalreporter.write_line(f"{duration:6.1f} s  {nodeid}")


def pytest_configure(config) -> None:
    global CHECK_TIER
    CHECK_TIER = config.getoption("tier") == "check"
    _Guard.install(config)
    config.pluginmanager.register(_FixtureOwners(), "gt-fixture-owners")


CHECK_EXAMPLES = 0.25  # share of a property test's max_examples that make check runs (at least 10)


def _fewer_examples(test) -> None:
    """A hypothesis test's settings, with CHECK_EXAMPLES of its examples. Every test here
    names its max_examples, which a hypothesis profile would not override, so the settings
    hypothesis keeps on the test (read when the test runs) are replaced."""
    given = getattr(test, "_hypothesis_internal_use_settings", None)
    if given is None or getattr(test, "hypothesis", None) is None:
        return
    from hypothesis import settings

    test._hypothesis_internal_use_settings = settings(
        given, max_examples=max(10, int(given.max_examples * CHECK_EXAMPLES)))


# --------------------------------------------------------------------------- the guard

TAG = "GT_TEST_TAG"  # every process a test starts carries "<run> <owner>" in its environment
LEAK_GRACE_S = 5.0  # a process still stopping gets this long after the teardown
SAMPLE_S = 2.0  # how often the guard looks for vLLM engines among the running test's processes
#: what a test started -> the markers that allow it
ALLOWED_BY = {"network": ("network", "engine"), "engine": ("engine",)}


class _Guard:
    """Markers that say what a test starts, and no process outliving what started it.

    Watched in this process: Popen (also under asyncio's subprocesses; not under subprocess.run
    and its kin, which run a command to completion); a sampler sees the engines the test's
    processes start in turn (vLLM's processes call themselves VLLM::...). An owner is
    a test, or a session, module or class fixture while it is set up. The run's own id starts
    every tag, so the last check (`pytest_sessionfinish`, also of the xdist controller) finds
    what anything of this run left behind, a crashed worker's too, and nothing of another run."""

    run = ""
    current = None  # the running test item
    completing = _threading.local()  # inside subprocess.run & co.
    tag = ""
    owners: dict = {}  # tag -> (its fixturedef or None, the pids there were when it began)
    violations: list = []

    @classmethod
    def install(cls, config) -> None:
        import uuid

        worker = getattr(config, "workerinput", None)
        cls.run = worker["gt_test_run"] if worker else uuid.uuid4().hex[:12]
        popen_init = _subprocess.Popen.__init__

        def watched_popen(self, args, *a, **kw):
            if not getattr(cls.completing, "on", False):
                cls.started("network", f"a process in the background ({_argv(args)})")
            if kw.get("env") is not None and cls.tag:
                kw["env"] = {TAG: cls.tag, **kw["env"]}  # an env with a tag of its own keeps it
            popen_init(self, args, *a, **kw)

        _subprocess.Popen.__init__ = watched_popen
        for name in ("run", "call", "check_call", "check_output"):
            cls._watch_completing(name)
        _threading.Thread(target=cls._sample, name="test-guard", daemon=True).start()

    @classmethod
    def _watch_completing(cls, name: str) -> None:
        run = getattr(_subprocess, name)

        def watched(*a, **kw):
            outer = getattr(cls.completing, "on", False)
            cls.completing.on = True
            try:
                return run(*a, **kw)
            finally:
                cls.completing.on = outer

        setattr(_subprocess, name, watched)

    @classmethod
    @_contextlib.contextmanager
    def owned_by(cls, owner: str, fixturedef=None):
        """Processes started inside belong to `owner`."""
        tag = f"{cls.run} {owner}"
        cls.owners[tag] = (fixturedef, _pids())
        before = cls.tag
        cls.tag = _os.environ[TAG] = tag
        try:
            yield tag
        finally:
            cls.tag = before
            if before:
                _os.environ[TAG] = before
            else:
                _os.environ.pop(TAG, None)

    @classmethod
    def started(cls, marker: str, what: str) -> None:
        item = cls.current
        if item is not None and not any(item.get_closest_marker(m) for m in ALLOWED_BY[marker]):
            cls.violations.append(f"{item.nodeid} started {what} but is not marked `{marker}` "
                                  f"(tests/conftest.py says when to mark a test)")

    @classmethod
    def _sample(cls) -> None:
        me = _psutil.Process()
        while True:
            _time.sleep(SAMPLE_S)
            item = cls.current
            if item is None or item.get_closest_marker("engine"):
                continue
            tag = cls.tag  # a session fixture's engine (the model node) carries the fixture's tag
            with _contextlib.suppress(_psutil.Error):
                engines = [p for p in me.children(recursive=True)
                           if _cmdline(p).startswith("VLLM::") and _tag_of(p.pid) == tag]
                if engines and cls.current is item:
                    cls.started("engine", f"a vLLM engine ({_cmdline(engines[0])}, pid {engines[0].pid})")

    @classmethod
    def check(cls) -> None:
        """After a test's teardown: its marker violations, then what it (or a fixture finalized
        in that teardown) left running, killed."""
        found, cls.violations = list(dict.fromkeys(cls.violations)), []
        ended = [t for t, (fixdef, _) in cls.owners.items()
                 if t == cls.tag or (fixdef is not None and fixdef.cached_result is None)]
        for tag in ended:
            _, before = cls.owners.pop(tag)
            found += _left_running(lambda t: t == tag, before)
        if found:
            pytest.fail("\n".join(found), pytrace=False)


def _left_running(owned: "Callable[[str], bool]", before: frozenset[int] = frozenset()) -> list[str]:
    """What processes started since `before` (pids) with a tag `owned` says is of interest
    still run, after a grace; killed, and said."""
    left = _tagged(owned, before)
    deadline = _time.monotonic() + LEAK_GRACE_S
    while left and _time.monotonic() < deadline:
        _time.sleep(0.2)
        left = [(p, tag) for p, tag in left if _alive(p)]
    by_owner: dict[str, list[str]] = {}
    for p, tag in left:
        by_owner.setdefault(tag.partition(" ")[2], []).append(f"pid {p.pid} {_cmdline(p)[:160]}")
        with _contextlib.suppress(_psutil.Error):
            p.kill()
    return [f"{owner} left {len(ps)} process(es) running after its teardown (killed now): " + "; ".join(ps)
            for owner, ps in by_owner.items()]


def _pids() -> frozenset[int]:
    return frozenset(int(d) for d in _os.listdir("/proc") if d.isdigit())


def _tagged(owned, before: frozenset[int]) -> list:
    """(process, tag) of the live processes not among `before` whose tag `owned` accepts (only
    their environments are read: this runs after every test, and a machine's processes are many)."""
    out = []
    for pid in _pids() - before:
        tag = _tag_of(pid)
        if tag is not None and owned(tag):
            with _contextlib.suppress(_psutil.Error):
                p = _psutil.Process(pid)
                if _alive(p):
                    out.append((p, tag))
    return out


def _tag_of(pid: int) -> "str | None":
    """The guard's tag in a process's environment (None: untagged, or gone)."""
    try:
        environ = _Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    return next((v.decode(errors="replace") for k, _, v in (e.partition(b"=") for e in environ.split(b"\0"))
                 if k == TAG.encode()), None)


def _argv(args) -> str:
    return (args if isinstance(args, (str, bytes)) else " ".join(map(str, args)))[:120]


def _cmdline(p) -> str:
    with _contextlib.suppress(_psutil.Error):
        return " ".join(p.cmdline()) or p.name()
    return ""


def _alive(p) -> bool:
    try:
        return p.is_running() and p.status() != _psutil.STATUS_ZOMBIE
    except _psutil.Error:
        return False


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """xdist controller: every worker tags with this run's id."""
    node.workerinput["gt_test_run"] = _Guard.run


class _FixtureOwners:
    """A session, package, module or class fixture owns the processes its set-up starts.

    A plugin of its own (registered in pytest_configure), not a hook of this conftest: pytest
    calls pytest_fixture_setup through the hooks visible from the node a fixture is scoped to,
    and a session fixture's node is the session, which sees no conftest below the rootdir (as a
    conftest hook it ran for function fixtures only, so the session's model node was owned by
    the first test using it and killed at that test's teardown)."""

    @pytest.hookimpl(wrapper=True)
    def pytest_fixture_setup(self, fixturedef, request):
        if fixturedef.scope == "function":
            return (yield)
        worker = getattr(request.config, "workerinput", {}).get("workerid", "")
        with _Guard.owned_by(f"fixture {fixturedef.argname!r} ({fixturedef.scope}{', ' + worker if worker else ''})",
                             fixturedef):
            return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _Guard.current = item
    try:
        with _Guard.owned_by(item.nodeid):
            return (yield)
    finally:
        _Guard.current = None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    try:
        return (yield)
    finally:
        _Guard.check()


def pytest_sessionfinish(session, exitstatus) -> None:
    """The last check, once everything is torn down (in the xdist controller: once every worker
    is gone): no process of this run still runs."""
    if getattr(session.config, "workerinput", None) is not None:
        return  # the controller looks, after this worker has exited
    left = _left_running(lambda tag: tag.startswith(_Guard.run + " "))
    if left:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        for line in left:
            if reporter is not None:
                reporter.write_line(f"LEAKED: {line}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
