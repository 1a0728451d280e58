"""Model-node fault scenarios on real processes (see the package docstring for the contract).

Two stand-in model nodes serve the same model as real `python -m testkit.echo_model` processes (real keys, pinned TLS, clove intake, signed receipts; the engine
echoes and streams in several slow chunks). The *victim* is listed with a higher reputation,
so every ask tries it first: the worst case for the user. In-process user nodes relay (the
overlay is not what is under test here) and one of them keeps asking while the victim

- `kill-mid-stream`: is SIGKILLed while it streams a reply to an ask (then stays dead);
- `hang`: is SIGSTOPped while it streams (a streamed ask first, then a buffered one), and
  SIGCONTed at the end;
- `garbage`: answers with reply messages that no decoder accepts (testkit.echo_model);
- `bad-signature`: answers right, with a receipt whose signature does not verify;
- `refuse`: admits no query (says busy).

Every ask must end with the right answer from the healthy node or a clear AskError within
its timeouts; an answer from a lying victim must never be accepted (counted as lost).
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import random
import signal
import time
from pathlib import Path

MODEL_MODES = ("kill-mid-stream", "hang", "garbage", "bad-signature", "refuse")
#: how each model node streams an answer: several chunks, slowly enough to be hit mid-stream
STREAM_CHUNKS, CHUNK_DELAY_S = 6, 0.2


def _spawn_model(sup, name: str, home: Path, directory: Path, extra: list[str]) -> None:
    from devnet.supervisor import python_module

    sup.spawn(name, python_module("testkit.echo_model", "--home", str(home), "--directory",
                                  str(directory), "--chunks", str(STREAM_CHUNKS),
                                  "--chunk-delay-s", str(CHUNK_DELAY_S), *extra),
              cwd=Path(__file__).resolve().parents[3])  # the repository root


def _started_node_id(log: Path) -> str | None:
    """The node id the echo-model process printed once it was serving (None before that)."""
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("{") and '"address"' in line:
            return json.loads(line)["node_id"]
    return None


async def _wait_started(sup, names: list[str], timeout_s: float = 90.0) -> dict[str, str]:
    ids: dict[str, str] = {}
    deadline = time.monotonic() + timeout_s
    while len(ids) < len(names):
        for name in names:
            if name not in ids:
                if not sup.alive(name):
                    raise RuntimeError(f"{name} exited: {(sup.logs / f'{name}.log').read_text()[-2000:]}")
                node_id = _started_node_id(sup.logs / f"{name}.log")
                if node_id:
                    ids[name] = node_id
        if time.monotonic() > deadline:
            raise TimeoutError(f"model processes {sorted(set(names) - set(ids))} did not start")
        await asyncio.sleep(0.1)
    return ids


def _prefer(directory: Path, node_id: str) -> None:
    """List `node_id` with a higher reputation than every other model node (so it is asked first)."""
    with open(directory.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        doc = json.loads(directory.read_text())
        for m in doc["models"]:
            m["reputation"] = 2.0 if m["node_id"] == node_id else 1.0
        tmp = directory.with_suffix(".tmp-prefer")
        tmp.write_text(json.dumps(doc, indent=1))
        tmp.replace(directory)


async def _wait_for(check, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.01)
    return True


class _Tally:
    """What the asking user saw: answered / clear errors / lost, and who answered."""

    def __init__(self, victim: str, expected_prefix: str, victim_lies: bool) -> None:
        self.victim, self.prefix, self.victim_lies = victim, expected_prefix, victim_lies
        self.sent = self.answered = self.clear = self.lost = 0
        self.accepted_from_victim = 0
        self.victim_tried = 0  # asks whose attempts included the victim
        self.victim_failures: list[str] = []  # "reason: detail" of every failed attempt on the victim
        self.errors: list[str] = []
        self.seconds: list[float] = []
        self.first_ok_at: float | None = None

    async def ask(self, me, prompt: str, limit_s: float) -> None:
        from user_client.asking import AskError

        self.sent += 1
        t0 = time.monotonic()
        try:
            answer = await asyncio.wait_for(me.ask(prompt), limit_s)
        except AskError as exc:
            self.clear += 1
            self.errors.append(str(exc)[:200])
            self._note_attempts(exc.attempts)
        except asyncio.TimeoutError:  # no answer and no error: a hang
            self.lost += 1
        else:
            self._note_attempts(answer.attempts)
            from_liar = self.victim_lies and answer.served_by == self.victim
            if answer.text == self.prefix + prompt and not from_liar:
                self.answered += 1
                if self.first_ok_at is None:
                    self.first_ok_at = time.monotonic()
            else:
                self.lost += 1  # a wrong answer, or a lying node's, accepted
            self.accepted_from_victim += answer.served_by == self.victim
        self.seconds.append(round(time.monotonic() - t0, 2))

    def _note_attempts(self, attempts: list[dict]) -> None:
        on_victim = [a for a in attempts if a["node"] == self.victim]
        self.victim_tried += bool(on_victim)
        self.victim_failures += [f"{a.get('reason')}: {a.get('detail')}" for a in on_victim if a.get("ok") is False]


async def _streamed_probe(user, sup, tally: _Tally, limit_s: float) -> dict:
    """A streamed ask (deltas shown as they come) whose node is paused after its first delta:
    once text was shown the node cannot be swapped, so it must end in a clear AskError."""
    from user_client.asking import Answer, AskError, Delta

    deltas, t0, outcome = 0, time.monotonic(), "answered"
    tally.sent += 1
    try:
        async with asyncio.timeout(limit_s):
            async for item in user.ask_stream("streamed ask, node paused mid-stream"):
                if isinstance(item, Delta):
                    deltas += 1
                    if deltas == 1:
                        sup.kill("victim", signal.SIGSTOP)
                elif isinstance(item, Answer):
                    tally.answered += item.served_by != tally.victim or not tally.victim_lies
    except AskError as exc:
        outcome = "clear error: " + str(exc)[:160]
        tally.clear += 1
    except TimeoutError:
        outcome = "hang"
        tally.lost += 1
    finally:
        sup.kill("victim", signal.SIGCONT)
    return {"outcome": outcome, "deltas_before_error": deltas, "seconds": round(time.monotonic() - t0, 2)}


async def _hit_mid_stream(me, sup, tally: _Tally, sig: int, after_chunks: int, limit_s: float) -> float:
    """Ask; once `after_chunks` chunks of the answer came in, signal the victim; the fault time."""
    base = me.asker.chunks_in
    ask = asyncio.ensure_future(tally.ask(me, "ask 0, hit mid-stream", limit_s))
    streaming = await _wait_for(lambda: me.asker.chunks_in >= base + after_chunks or ask.done(), 30)
    if not streaming or ask.done():
        ask.cancel()
        raise RuntimeError("the victim never streamed the first ask")
    sup.kill("victim", sig)
    fault_at = time.monotonic()
    await ask
    return fault_at


async def model_faults(root: Path, mode: str, seed: int = 0, quick: bool = False) -> dict:
    """One victim model process has `mode`; see the module docstring. `me` asks throughout
    (it learns to try the victim last), `other` asks once while the fault lasts (it has not
    learned: the victim is tried first), and in `hang` a third user streams an ask that the
    victim stops answering mid-stream."""
    from gentorrent.config import CloveParams, OverlayParams
    from devnet.supervisor import Supervisor
    from testkit.keyleaks import leak_report
    from user_client.asking import AskError
    from testkit.echo_model import ECHO_PREFIX
    from testkit.localnet import start_user_nodes

    if mode not in MODEL_MODES:
        raise ValueError(f"mode is one of {MODEL_MODES}")
    rng = random.Random(seed)
    # n and k as the model processes use them (the config defaults); short paths: relays are not under test
    cloves = CloveParams(path_length=2, proxies_kept=CloveParams().n + 1)
    params = OverlayParams(first_reply_timeout_s=3.0, reply_idle_timeout_s=2.5, forward_timeout_s=2.0,
                           establish_timeout_s=5.0, maintenance_interval_s=1.0, build_attempts=12)
    limit_s = 3 * (params.first_reply_timeout_s + params.reply_idle_timeout_s) + 20  # past every timeout
    root = Path(root)
    directory = root / "directory.json"
    sup = Supervisor(root / "procs")
    victim_flags = {"garbage": ["--misbehave", "garbage"], "bad-signature": ["--misbehave", "bad-signature"],
                    "refuse": ["--admit", "0"]}.get(mode, [])
    nodes = []
    extra: dict = {}
    warmup_failures = 0
    try:
        _spawn_model(sup, "victim", root / "victim", directory, victim_flags)
        _spawn_model(sup, "healthy", root / "healthy", directory, [])
        ids = await _wait_started(sup, ["victim", "healthy"])
        victim, healthy = ids["victim"], ids["healthy"]
        _prefer(directory, victim)
        nodes = await start_user_nodes(6, directory, root / "users", cloves=cloves, params=params, maintain=False)
        me, other, streamer = nodes[0], nodes[1], nodes[2]
        await asyncio.gather(*(n.paths.fill() for n in (me, other, streamer)))
        for _ in range(3):  # channels, paths, and the model process learning the new proxies
            try:
                await me.ask("warm up", node_id=healthy)
                break
            except AskError:
                warmup_failures += 1
        built_before = me.paths.built + other.paths.built
        failed_before = me.paths.failed + other.paths.failed
        tally = _Tally(victim, ECHO_PREFIX, victim_lies=mode in ("garbage", "bad-signature"))
        asks = 3 if quick else 8
        fault_at = time.monotonic()
        if mode in ("kill-mid-stream", "hang"):
            sig = signal.SIGKILL if mode == "kill-mid-stream" else signal.SIGSTOP
            fault_at = await _hit_mid_stream(me, sup, tally, sig, rng.randint(1, STREAM_CHUNKS - 2), limit_s)
            asks -= 1
        for i in range(asks):
            await tally.ask(me, f"ask {i} under {mode}", limit_s)
        tried_before = tally.victim_tried
        await tally.ask(other, f"another user's ask under {mode}", limit_s)
        extra["other_user"] = {"tried_victim": tally.victim_tried > tried_before, "seconds": tally.seconds[-1]}
        extra["paths_rebuilt"] = me.paths.built + other.paths.built - built_before  # (an ask's paths are single-use)
        extra["paths_failed"] = me.paths.failed + other.paths.failed - failed_before
        if mode == "hang":  # the paused node comes back: asks go on being answered
            sup.kill("victim", signal.SIGCONT)
            before = tally.answered
            await tally.ask(me, "ask after the victim resumed", limit_s)
            extra["answered_after_resume"] = tally.answered > before
            extra["streamed_ask_paused_mid_stream"] = await _streamed_probe(streamer, sup, tally, limit_s)
        extra["asker_drops"] = me.asker.status()["drops"]
    finally:
        for n in nodes:
            await n.stop()
        if sup.alive("victim"):
            sup.kill("victim", signal.SIGCONT)  # a stopped process cannot act on SIGTERM
        await asyncio.to_thread(sup.stop_all, 10.0)
    recover_s = None if tally.first_ok_at is None else round(tally.first_ok_at - fault_at, 2)
    extra.update({"victim_accepted": tally.accepted_from_victim, "victim_tried_in_asks": tally.victim_tried,
                  "victim_failures": tally.victim_failures,
                  "ask_seconds": tally.seconds, "errors": tally.errors,
                  # the model processes' stdout/stderr, for their own keys in any encoding
                  "model_log_key_leaks": leak_report((root / "procs" / "logs").glob("*.log"),
                                                     [root / "victim", root / "healthy"]),
                  "warmup_failures": warmup_failures})
    return {"requests_sent": tally.sent, "answered": tally.answered, "lost": tally.lost,
            "failed_clearly": tally.clear, "committed_txs_lost": None, "forks": None, "recover_s": recover_s,
            "note": f"{mode} on 1 of 2 model processes, listed first; {tally.victim_tried} of {tally.sent} "
                    f"asks tried it, {tally.accepted_from_victim} answers accepted from it, "
                    f"{extra['paths_failed']} paths failed",
            "extra": extra}
