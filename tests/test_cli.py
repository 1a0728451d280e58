"""The command-line tools as a user meets them: help on every option, --version, one line and
exit status 2 for every bad argument or file (and nothing changed), a question from stdin,
sessions across `gt-user ask` processes, start-up stages."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import gentorrent
from devnet import network as devnet
from gentorrent.cli import every_option_has_help
from gentorrent.home_lock import LOCK_FILE
from model_node import cli as model_cli
from testkit.committee import free_base_port
from testkit.echo_model import ECHO_PREFIX, EchoModelNode
from user_client import cli as user_cli
from verifier import cli as verifier_cli

ROOT = Path(__file__).resolve().parents[1]
TOOLS = {"gt-user": "user_client.cli", "gt-model": "model_node.cli", "gt-verifier": "verifier.cli",
         "gt-devnet": "devnet.network"}


def _cli(module: str, *args: str, stdin: bytes | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args], input=stdin, capture_output=True, timeout=timeout,
                          cwd=ROOT)


def _one_line_error(out: subprocess.CompletedProcess, *words: str, code: int = 2) -> str:
    err = out.stderr.decode()
    assert out.returncode == code, (out.returncode, err)
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    for word in words:
        assert word in err, (word, err)
    return err


@pytest.mark.parametrize("build", [user_cli.parser, model_cli.build_parser, verifier_cli.build_parser,
                                   devnet.build_parser], ids=list(TOOLS))
def test_every_option_and_command_has_help(build):
    assert every_option_has_help(build()) == []


@pytest.mark.parametrize("prog,module", list(TOOLS.items()))
def test_version(prog, module):
    out = _cli(module, "--version")
    assert out.returncode == 0 and out.stdout.decode().strip() == f"{prog} {gentorrent.__version__}"


def test_a_port_whose_old_connections_sit_in_time_wait_passes_the_listen_check():
    """A node restarted on its port (a verifier after a crash) binds it, as grpc does with
    SO_REUSEADDR; the check before starting must not refuse it. A live listener still fails."""
    from gentorrent.cli import UsageError, check_can_listen

    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as grpc's and aiohttp's listeners
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    accepted, _ = listener.accept()
    accepted.close()  # the server side closes first: its end waits in TIME_WAIT on `port`
    client.close()
    with pytest.raises(UsageError, match="cannot listen on --listen"):
        check_can_listen(f"127.0.0.1:{port}", "--listen")
    listener.close()
    with socket.socket() as plain, pytest.raises(OSError):
        plain.bind(("127.0.0.1", port))  # what the check did before: a restart was refused
    check_can_listen(f"127.0.0.1:{port}", "--listen")


# --------------------------------------------------------------------------- gt-user


def _taken_port() -> tuple[socket.socket, int]:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s, s.getsockname()[1]


def test_gt_user_start_refuses_bad_arguments_and_files_changing_nothing(tmp_path):
    directory = tmp_path / "directory.json"
    directory.write_text('{"users": [], "models": []}')
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    holder, taken = _taken_port()
    home = tmp_path / "home"
    try:
        cases = [
            (("--directory", str(bad)), "not a directory file"),
            (("--committee", str(bad)), "not a usable genesis file"),
            (("--directory", str(tmp_path / "missing.json")), "does not exist"),
            (("--listen", "nonsense"), "is not HOST:PORT"),
            (("--api-listen", "127.0.0.1:99999"), "from 0 to 65535"),
            (("--api-listen", f"127.0.0.1:{taken}"), "cannot listen on --api-listen"),
            (("--api-listen", "0.0.0.0:0"), "--api-key"),  # every interface and no key: anyone would ask as you
            (("--cors-origin", "evil"), "--cors-origin"),
            (("--trust-anchor", "12:abc"), "HEIGHT:HASH"),
            (("--trust-anchor", f"12:{'ab' * 32}"), "goes with --committee"),
        ]
        for args, words in cases:
            extra = () if args[0] in ("--directory", "--committee") else ("--directory", str(directory))
            out = _cli("user_client.cli", "start", "--home", str(home), *extra, *args)
            _one_line_error(out, words)
            assert directory.read_text() == '{"users": [], "models": []}', args  # nobody registered
            assert not (home / "node.json").exists()
    finally:
        holder.close()


def test_gt_user_ask_without_a_node_and_with_bad_arguments(tmp_path):
    _one_line_error(_cli("user_client.cli", "ask", "hi", "--home", str(tmp_path)), "no running user node", code=3)
    _one_line_error(_cli("user_client.cli", "ask", "hi", "--temperature", "9"), "--temperature")
    _one_line_error(_cli("user_client.cli", "ask", "-", "--home", str(tmp_path), stdin=b"  \n"), "empty")
    _one_line_error(_cli("user_client.cli", "frobnicate"), "invalid choice")


@pytest.mark.network
@pytest.mark.timeout(240)
async def test_gt_user_processes_ask_from_stdin_keep_sessions_and_report_stages(tmp_path):
    """Four `gt-user start` processes relay for each other; `gt-user ask` answers through them."""
    directory = tmp_path / "directory.json"
    model = EchoModelNode(tmp_path / "model", directory)
    await model.start()
    procs = []
    try:
        for i in range(4):
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "user_client.cli", "start", "--home", str(tmp_path / f"u{i}"),
                "--directory", str(directory), cwd=ROOT, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE)
            procs.append(proc)
            line = await asyncio.wait_for(proc.stdout.readline(), 60)
            assert json.loads(line)["api"].startswith("http://127.0.0.1:")
        home = str(tmp_path / "u3")
        for _ in range(30):  # the nodes started first learn of the later ones within seconds
            out = await asyncio.to_thread(_cli, "user_client.cli", "status", "--home", home, "--json")
            if out.returncode == 0 and json.loads(out.stdout)["paths"]["usable"] >= 4:
                break
            await asyncio.sleep(1)
        big = ("Why is the sky blue? " * 10_000).encode()  # 210 KB: beyond a command line's limit
        out = await asyncio.to_thread(_cli, "user_client.cli", "ask", "-", "--home", home, stdin=big)
        assert out.returncode == 0, out.stderr
        assert out.stdout.decode().strip() == ECHO_PREFIX + "user: " + big.decode().strip()
        assert "served by" in out.stderr.decode() and "prompt +" in out.stderr.decode()
        assert model.requests[-1].stream and model.requests[-1].messages[0].role == "user"  # chat, streamed
        for turn in ("My name is Ada.", "What is my name?"):
            out = await asyncio.to_thread(_cli, "user_client.cli", "ask", turn, "--home", home, "--session", "s1",
                                          "--no-stream", "--json")
            assert out.returncode == 0, out.stderr
        sent = model.requests[-1]
        assert [m.content for m in sent.messages if m.role == "user"] == ["My name is Ada.", "What is my name?"]
        assert not sent.stream and len(sent.session_id) == 16
        out = await asyncio.to_thread(_cli, "user_client.cli", "ask", "x", "--home", home, "--model", "no-such")
        _one_line_error(out, "no-such")  # not in the directory: the user's mistake, decided locally
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.terminate()
        logs = [(await asyncio.wait_for(proc.communicate(), 30))[1].decode() for proc in procs]
        await model.stop()
    assert all("[3/3] building proxy paths" in log for log in logs), logs[0]
    assert any("proxy paths held" in log for log in logs)


# --------------------------------------------------------------------------- gt-verifier


def test_gt_verifier_init_validates_ports_counts_and_files(tmp_path):
    out = _cli("verifier.cli", "init", "--home", str(tmp_path / "obs"), "--listen", "127.0.0.1:1",
               "--join", str(tmp_path / "bad.json"))
    _one_line_error(out, "not a usable genesis file")
    assert not (tmp_path / "obs").exists()
    _one_line_error(_cli("verifier.cli", "init", "--out", str(tmp_path / "c"), "--base-port", "70000"),
                    "from 1 to 65535")
    _one_line_error(_cli("verifier.cli", "init", "--out", str(tmp_path / "c"), "--base-port", "65534"),
                    "above 65535")
    _one_line_error(_cli("verifier.cli", "init", "--out", str(tmp_path / "c"), "--validators", "0"), "from 1")
    assert not (tmp_path / "c").exists()
    _one_line_error(_cli("verifier.cli", "start", "--home", str(tmp_path / "none")), "not a verifier's home")
    out = _cli("verifier.cli", "init", "--out", str(tmp_path / "c"), "--validators", "2", "--base-port", "40000")
    assert out.returncode == 0 and "tolerates no faulty" in out.stderr.decode()
    assert json.loads(out.stdout)["listen"] == ["127.0.0.1:40000", "127.0.0.1:40001"]
    _one_line_error(_cli("verifier.cli", "init", "--out", str(tmp_path / "c"), "--validators", "2"),
                    "already holds a verifier")


def test_gt_verifier_init_hosts_gives_each_member_its_own_host(tmp_path):
    """A committee on several machines (the WAN devnet's members, each in its own namespace)."""
    _one_line_error(_cli("verifier.cli", "init", "--out", str(tmp_path / "c"), "--validators", "3",
                         "--hosts", "10.1.0.1,10.2.0.1"), "names 2 hosts for 3 members")
    assert not (tmp_path / "c").exists()
    out = _cli("verifier.cli", "init", "--out", str(tmp_path / "c"), "--validators", "2", "--base-port", "40000",
               "--hosts", "10.1.0.1,10.2.0.1")
    assert out.returncode == 0, out.stderr.decode()
    assert json.loads(out.stdout)["listen"] == ["10.1.0.1:40000", "10.2.0.1:40001"]
    genesis = json.loads((tmp_path / "c" / "v1" / "genesis.json").read_text())
    assert [v["address"] for v in genesis["validators"]] == ["10.1.0.1:40000", "10.2.0.1:40001"]


def _one_member(tmp_path) -> Path:
    out = _cli("verifier.cli", "init", "--out", str(tmp_path / "c"), "--validators", "1",
               "--base-port", str(free_base_port(1)))
    assert out.returncode == 0, out.stderr.decode()
    return tmp_path / "c" / "v0"


def test_gt_verifier_start_refuses_a_taken_port_before_starting_anything(tmp_path):
    home = _one_member(tmp_path)
    before = sorted(p.relative_to(home) for p in home.rglob("*"))
    holder, taken = _taken_port()
    try:
        for option in ("--dashboard", "--listen"):
            out = _cli("verifier.cli", "start", "--home", str(home), option, f"127.0.0.1:{taken}")
            _one_line_error(out, f"cannot listen on {option} 127.0.0.1:{taken}")
    finally:
        holder.close()
    after = sorted(p.relative_to(home) for p in home.rglob("*") if p.name != LOCK_FILE)  # the home lock's file
    assert after == before  # no block store, no WAL


def test_gt_verifier_start_whose_port_is_taken_while_it_starts_says_so_and_stops_cleanly(tmp_path):
    """Seen in CI: a port taken between choosing it and binding it, after the member had
    started its servers. The user must get one clear line and an exit, not grpc's teardown
    tracebacks. (The check before starting is patched out: that is the race.)"""
    home = _one_member(tmp_path)
    holder, taken = _taken_port()
    script = ("import sys; from verifier import cli; cli.check_can_listen = lambda *a: None; "
              f"sys.exit(cli.main(['start', '--home', {str(home)!r}, '--dashboard', '127.0.0.1:{taken}']))")
    try:
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=120, cwd=ROOT)
    finally:
        holder.close()
    err = out.stderr.decode()
    assert out.returncode == 1, err
    assert "Traceback" not in err and "Exception ignored" not in err, err
    assert f"--dashboard 127.0.0.1:{taken}: cannot listen there" in err.strip().splitlines()[-1], err


# --------------------------------------------------------------------------- gt-model


def test_gt_model_refuses_a_taken_port_before_loading_anything(tmp_path):
    holder, taken = _taken_port()
    try:
        out = _cli("model_node.cli", "serve", "--home", str(tmp_path), "--listen", f"127.0.0.1:{taken}")
        metrics = _cli("model_node.cli", "serve", "--home", str(tmp_path), "--listen", "127.0.0.1:0",
                       "--metrics", f"127.0.0.1:{taken}")
    finally:
        holder.close()
    _one_line_error(out, "cannot listen on", "--listen")
    _one_line_error(metrics, "cannot listen on", "--metrics")
    assert not (tmp_path / "node.json").exists()


def test_gt_model_refuses_a_trust_anchor_without_a_committee_or_malformed(tmp_path):
    anchor = f"7:{'cd' * 32}"
    _one_line_error(_cli("model_node.cli", "serve", "--home", str(tmp_path), "--trust-anchor", anchor),
                    "goes with --committee")
    _one_line_error(_cli("model_node.cli", "serve", "--home", str(tmp_path), "--trust-anchor", "7"), "HEIGHT:HASH")
    assert not (tmp_path / "node.json").exists()


@pytest.mark.engine
def test_gt_model_start_up_shows_its_stages(model_node):
    log = (model_node.home / "serve.out").read_text()
    for stage in model_cli.STAGES:
        assert f"] {stage}" in log and f"{stage}: done in" in log, stage
    assert "ready after" in log


# --------------------------------------------------------------------------- gt-devnet


def test_gt_devnet_root_after_the_command_and_a_stopped_devnet(tmp_path, capsys):
    root = tmp_path / "net"
    for args in (("status", "--root", str(root)), ("--root", str(root), "ask", "hi")):
        out = _cli("devnet.network", *args)
        _one_line_error(out, "no devnet at", "gt-devnet up", code=3)
    holder, dead = _taken_port()
    holder.close()  # nothing listens there any more
    root.mkdir()
    user = devnet.NodeInfo("u00", "user", str(root / "u00"), "127.0.0.1:1", "aa" * 32,
                           {"api": f"http://127.0.0.1:{dead}"})
    devnet.DevnetState(str(root), "c", str(root / "genesis.json"), [user]).save()
    _one_line_error(_cli("devnet.network", "ask", "hi", "--root", str(root)), "nothing answers", "is the devnet up",
                    code=3)
    _one_line_error(_cli("devnet.network", "up", "--users", "2", "--root", str(root)), "--users")


def test_gt_devnet_up_warns_about_a_committee_that_tolerates_no_fault(tmp_path, monkeypatch, capsys):
    def refuse(*_a, **_k):
        raise devnet.DevnetError("stopped here by the test")

    monkeypatch.setattr(devnet, "up", refuse)
    assert devnet.main(["--root", str(tmp_path), "up", "--verifiers", "2"]) == 1
    err = capsys.readouterr().err
    assert "warning: a committee of 2 tolerates no faulty" in err and "stopped here by the test" in err


def test_devnet_waits_say_how_far_they_are_and_how_long_it_usually_takes(tmp_path):
    from devnet.supervisor import wait_until

    notes, ready = [], iter([False, False, False, True])
    wait_until(lambda: next(ready), 10, "2 engines to serve", notes.append, poll_s=0.05,
               status=lambda: "honest0 [2/3] loading the vLLM engine: 31 s of ~20 s", usual_s=45, note_every_s=0.01)
    assert notes and "honest0 [2/3] loading the vLLM engine" in notes[0] and "of ~45s usual" in notes[0]
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "model-a.log").write_text("INFO vllm ...\ngt-model: [1/3] preparing the weights ...\n"
                                      "gt-model: [2/3] loading the vLLM engine: 15 s of ~20 s\nWARNING x\n")
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "node.json").write_text("{}")

    class Sup:
        pass

    sup = Sup()
    sup.logs = logs
    assert devnet._engine_stages(sup, {"a": tmp_path / "a", "b": tmp_path / "b"}) == \
        "a [2/3] loading the vLLM engine: 15 s of ~20 s, b serving"


def test_stages_say_which_stage_how_long_and_how_long_it_usually_takes():
    import io

    from gentorrent.cli import Stages

    now = [100.0]
    out = io.StringIO()
    stages = Stages("gt-x", ["loading", "registering"], out=out, clock=lambda: now[0])
    stages.begin("loading", usual_s=40, detail="model m")
    now[0] += 30
    stages.note()
    stages.begin("registering")
    now[0] += 2.5
    stages.finish("serving")
    assert out.getvalue().splitlines() == [
        "gt-x: [1/2] loading: model m, usually ~40 s ...", "gt-x: [1/2] loading: 30 s of ~40 s",
        "gt-x: [1/2] loading: done in 30.0 s", "gt-x: [2/2] registering ...", "gt-x: [2/2] registering: done in 2.5 s",
        "gt-x: serving (ready after 32.5 s)"]


def test_gt_devnet_up_prints_the_dashboards_and_the_openai_api_url(tmp_path, monkeypatch, capsys):
    user = devnet.NodeInfo("u00", "user", str(tmp_path / "u00"), extra={"api": "http://127.0.0.1:5555"})
    verifier = devnet.NodeInfo("v0", "verifier", str(tmp_path / "v0"), extra={"dashboard": "http://127.0.0.1:6666/"})
    monkeypatch.setattr(devnet, "up", lambda *a, **k: devnet.DevnetState(str(tmp_path), "c", "", [verifier, user]))
    assert devnet.main(["up", "--root", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "dashboard of v0: http://127.0.0.1:6666/" in out and "http://127.0.0.1:5555/v1" in out
