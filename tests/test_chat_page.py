"""The chat page at / of the user node's API, in a real browser: Debian's chromium driven by
Selenium through chromium-driver (deploy/install_system.sh installs both).

Asked through the real overlay of user nodes to the echo model node (its answer is known and
streams in four chunks): the answer appears as it streams, names the serving node, its
reputation and the relays of every path; after a reload the session (kept on the node, not in
the browser) is listed and shows the conversation again.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time

import pytest

from gentorrent.config import CloveParams, OverlayParams
from testkit.browser import FLAGS
from testkit.echo_model import ECHO_PREFIX, EchoModelNode
from testkit.localnet import start_user_nodes
from user_client.openai_api import ApiServer

pytestmark = [pytest.mark.network, pytest.mark.timeout(300)]

CLOVES = CloveParams(n=4, k=3, path_length=3, proxies_kept=4)
FAST = OverlayParams(first_reply_timeout_s=15.0, reply_idle_timeout_s=15.0, forward_timeout_s=5.0,
                     establish_timeout_s=5.0, maintenance_interval_s=1.0)
QUESTION = "Why is the sky blue?"


def _driver(profile: str):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium, chromedriver = shutil.which("chromium"), shutil.which("chromedriver")
    if not chromium or not chromedriver:
        pytest.skip("Debian chromium and chromium-driver are not installed (deploy/install_system.sh)")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in (*FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    return webdriver.Chrome(service=Service(chromedriver), options=options)


def _ask_and_reload(url: str) -> dict:
    """In the browser: ask, watch the answer grow, reload, read the session back."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    seen: dict = {"growth": []}
    with tempfile.TemporaryDirectory(prefix="gt-chat-") as profile:
        driver = _driver(profile)
        try:
            driver.get(url)
            wait = WebDriverWait(driver, 60)
            wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#model option"))
            seen["models"] = [o.text for o in driver.find_elements(By.CSS_SELECTOR, "#model option")]
            driver.find_element(By.ID, "q").send_keys(QUESTION)
            driver.find_element(By.ID, "send").click()
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not driver.find_elements(By.CSS_SELECTOR, ".note"):
                texts = [e.text for e in driver.find_elements(By.CSS_SELECTOR, ".msg.assistant")]
                if texts and texts[-1] and (not seen["growth"] or seen["growth"][-1] != texts[-1]):
                    seen["growth"].append(texts[-1])
                time.sleep(0.02)
            seen["answer"] = driver.find_elements(By.CSS_SELECTOR, ".msg.assistant")[-1].text
            seen["note"] = driver.find_element(By.CSS_SELECTOR, ".note").text
            driver.refresh()
            wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, ".session")))
            wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, ".msg.assistant"))
            seen["sessions"] = [e.text for e in driver.find_elements(By.CSS_SELECTOR, ".session")]
            seen["after_reload"] = [(e.get_attribute("class"), e.text) for e in driver.find_elements(By.CSS_SELECTOR, ".msg")]
            seen["note_after_reload"] = [e.text for e in driver.find_elements(By.CSS_SELECTOR, ".note")]
        finally:
            driver.quit()
    return seen


async def test_the_chat_page_streams_an_answer_and_keeps_the_session_on_the_node(tmp_path):
    directory = tmp_path / "directory.json"
    model = EchoModelNode(tmp_path / "model", directory, chunks=4, chunk_delay_s=0.4, cloves=CLOVES, params=FAST)
    await model.start()
    nodes = await start_user_nodes(13, directory, tmp_path, cloves=CLOVES, params=FAST, maintain=False)
    await nodes[0].paths.fill()
    server = ApiServer(nodes[0])
    await server.start()
    try:
        seen = await asyncio.to_thread(_ask_and_reload, server.url + "/")
    finally:
        await server.stop()
        for node in nodes:
            await node.stop()
        await model.stop()
    expected = ECHO_PREFIX + "user: " + QUESTION
    assert seen["models"] == ["smollm2-135m"]
    assert seen["answer"] == expected
    assert len(seen["growth"]) >= 2 and all(expected.startswith(g) for g in seen["growth"]), seen["growth"]
    assert seen["note"].startswith(f"served by {model.record.node_id_hex[:16]}") and "reputation 1.000" in seen["note"]
    assert seen["note"].count("→") == 8  # 4 paths of 3 relays
    assert len(seen["sessions"]) == 1 and seen["sessions"][0].startswith("chat-")
    assert seen["after_reload"] == [("msg user", QUESTION), ("msg assistant", expected)]
    assert seen["note_after_reload"] == [seen["note"]]
    assert [r.messages[-1].content for r in model.requests] == [QUESTION]
