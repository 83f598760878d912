"""The chat page of `specdec serve` (serve/webui.py, serve/static/) in a real browser: headless
Chromium driven through chromedriver by selenium (a maintained WebDriver client, rather than
DevTools-protocol code of our own), against a real server of smollm2-135m on 127.0.0.1 that
wants an API key.  The page is loaded, asks for the key, sends a prompt, and its coloured
tokens spell the API's own answer; the stop button cancels the stream and frees the slot
(per /metrics); an answer holding markup stays text.  Chromium talks to loopback only (the
background-networking flags below keep it off every other address).

Skipped, saying why, where no Chromium and chromedriver are installed (Debian: `apt-get
install chromium chromium-driver`; .ci/run installs them).  The screenshot goes to the test's
tmp folder; with SPECDEC_UPDATE_SCREENSHOT=1 also to docs/img/webui.png (the README's).
"""
from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

import httpx
import pytest

from servers import ROOT, Server

pytestmark = [pytest.mark.real, pytest.mark.slow]

KEY = "webui-test-key-51c9"
PROMPT = "Write a Python function that checks whether a number is prime, then explain it in two sentences."
N_TOKENS = 160
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--window-size=1280,900"]
TOKENS_JS = ("return Array.from(arguments[0].querySelectorAll('.body .tok'))"
             ".map(e => [e.textContent, e.className])")


def find_browser() -> tuple[str, str]:
    browser = next(filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None)
    driver = shutil.which("chromedriver") or ("/usr/bin/chromedriver" if Path("/usr/bin/chromedriver").exists()
                                              else None)
    if browser is None or driver is None:
        pytest.skip("no headless browser: needs chromium and chromedriver "
                    "(Debian: apt-get install chromium chromium-driver)")
    return browser, driver


@pytest.fixture(scope="module")
def driver():
    browser, chromedriver = find_browser()
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install selenium)")
    from selenium.webdriver.chrome.service import Service
    opts = webdriver.ChromeOptions()
    opts.binary_location = browser
    profile = tempfile.mkdtemp(prefix="specdec-chromium-")
    for flag in [*FLAGS, f"--user-data-dir={profile}"]:
        opts.add_argument(flag)
    d = webdriver.Chrome(service=Service(chromedriver), options=opts)
    d.set_script_timeout(30)
    yield d
    d.quit()
    shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from helpers import real_model_path
    path = str(real_model_path("smollm2-135m-instruct-q4_1"))
    # -t 1: the browser shares the host's cores; a second OpenMP worker would only contend
    s = Server(["-m", path, "-md", path, "-a", "smollm2-135m-instruct-q4_1", "-np", "2", "-c", "2048",
                "-t", "1", "--api-key", KEY],
               tmp_path_factory.mktemp("webui") / "server.log", key=KEY)
    yield s
    s.stop()


def wait(d, js: str, timeout: float, *args):
    """Poll a script until it returns something truthy."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = d.execute_script(js, *args)
        if v:
            return v
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout} s waiting for: {js}")


def by_id(d, id_):
    from selenium.webdriver.common.by import By
    return d.find_element(By.ID, id_)


def fill(d, id_: str, value: str) -> None:
    el = by_id(d, id_)
    el.clear()
    el.send_keys(value)


def open_page(d, s: Server) -> None:
    d.get(s.url + "/")
    assert KEY not in d.page_source
    status = wait(d, "const t = document.getElementById('model').textContent;"
                     "return (t.includes('API key') || t.includes('smollm2')) && t", 10)
    if "smollm2" in status:             # the key the page was given earlier (sessionStorage)
        return
    fill(d, "apikey", KEY)
    d.execute_script("document.getElementById('apikey').dispatchEvent(new Event('change'))")
    wait(d, "return document.getElementById('model').textContent.includes('smollm2')", 10)


def last_answer(d):
    return d.execute_script("const m = document.querySelectorAll('.msg.assistant'); return m[m.length - 1]")


def test_the_page_chats_and_colours_the_api_answer(driver, server, tmp_path):
    d, s = driver, server
    # the API's answer to the request the page will send: seeded sampling, so p(x) and q(x)
    # mean something, with a draft length (the threshold policy: no timing decides a draft, so
    # the same draws); the first speculative request also compiles the kernels' remaining paths
    ask = {"temperature": 0.7, "seed": 2, "draft": "hybrid", "draft_n": 4, "max_tokens": N_TOKENS}
    r = httpx.post(s.url + "/v1/chat/completions", headers=s.headers, timeout=300,
                   json={"messages": [{"role": "user", "content": PROMPT}], **ask, "specdec": {"tokens": True}})
    assert r.status_code == 200, r.text
    text, api_tokens = r.json()["choices"][0]["message"]["content"], r.json()["specdec"]["tokens"]
    open_page(d, s)
    fill(d, "temperature", str(ask["temperature"]))
    fill(d, "seed", str(ask["seed"]))
    fill(d, "draft-n", str(ask["draft_n"]))
    fill(d, "max-tokens", str(N_TOKENS))
    from selenium.webdriver.support.ui import Select
    Select(by_id(d, "draft")).select_by_value(ask["draft"])
    by_id(d, "compare").click()
    fill(d, "prompt", PROMPT)
    by_id(d, "send").click()
    answer = wait(d, "const m = document.querySelector('.msg.assistant');"
                     "return m && m.dataset.state !== 'streaming' && m", 90)
    assert answer.get_attribute("data-state") == "done", answer.text
    wait(d, "return arguments[0].dataset.compared", 60, answer)
    pieces = d.execute_script(TOKENS_JS, answer)
    assert "".join(t for t, _ in pieces) == text            # the coloured tokens spell the answer
    kinds = {c.split()[1] for _, c in pieces}
    shown = d.execute_script("return Array.from(arguments[0].querySelectorAll('.body .tok'))"
                             ".map(e => [Number(e.dataset.i), e.className.split(' ')[1]])", answer)
    assert all(kind == "k-" + api_tokens[i]["kind"] for i, kind in shown)    # each token's colour
    assert "k-bonus" in kinds and kinds <= {"k-accepted", "k-correction", "k-bonus", "k-predicted"}
    has_code = d.execute_script("return arguments[0].querySelector('pre.code') !== null", answer)
    assert has_code == ("```" in text)
    panel = {e.get_attribute("data-k"): e.get_attribute("data-value")
             for e in answer.find_elements("css selector", ".panel .stat")}
    assert {"drafting", "drafters", "tokens_per_step", "acceptance", "speed", "compare"} <= set(panel)
    assert float(panel["tokens_per_step"]) > 1 and float(panel["compare"]) > 0
    from selenium.webdriver.common.action_chains import ActionChains
    unsure = [i for i, t in enumerate(api_tokens)               # accepted drafts, p(x) < 1
              if t["kind"] == "accepted" and t["p"] < 0.99 and len(t["text"].strip()) > 2]
    tok = answer.find_element("css selector", f'.body .tok[data-i="{(unsure or [0])[-1]}"]')
    ActionChains(d).move_to_element(tok).perform()
    tip = by_id(d, "tip")
    assert tip.is_displayed() and "p(x)" in tip.text and "step" in tip.text
    shot = tmp_path / "webui.png"
    d.save_screenshot(str(shot))
    assert shot.stat().st_size > 10_000
    if os.environ.get("SPECDEC_UPDATE_SCREENSHOT") == "1":
        shutil.copy(shot, ROOT / "docs" / "img" / "webui.png")


def test_the_stop_button_cancels_and_frees_the_slot(driver, server):
    d, s = driver, server
    before = s.metrics().get('specdec_requests_total{status="cancelled"}', 0)
    open_page(d, s)
    by_id(d, "clear").click()
    fill(d, "temperature", "0")
    fill(d, "max-tokens", "1500")
    fill(d, "prompt", "Count from 1 to 1000, one number per line.")
    by_id(d, "send").click()
    wait(d, "const m = document.querySelector('.msg.assistant');"
            "return m && m.querySelectorAll('.tok').length > 20", 60)
    assert s.metrics()["specdec_slots_busy"] == 1
    by_id(d, "stop").click()
    wait(d, "return document.querySelector('.msg.assistant').dataset.state === 'stopped'", 10)
    deadline = time.monotonic() + 15
    while s.metrics()["specdec_slots_busy"] != 0 and time.monotonic() < deadline:
        time.sleep(0.2)
    m = s.metrics()
    assert m["specdec_slots_busy"] == 0 and m['specdec_requests_total{status="cancelled"}'] == before + 1
    assert by_id(d, "send").is_enabled() and not by_id(d, "stop").is_enabled()


SSE_JS = """
const [payload] = arguments;
window.fetch = async (url, opts) => {
  if (!String(url).includes('/chat/completions')) return new Response('{}', {status: 200});
  const chunk = (obj) => 'data: ' + JSON.stringify(obj) + '\\n\\n';
  const tokens = payload.match(/.{1,7}/gs).map((t, i) => ({id: i, text: t, kind: i % 2 ? 'bonus' : 'accepted',
                                                          step: i, pos: 1, p: 0.5, q: 0.5}));
  const body = chunk({choices: [{index: 0, delta: {role: 'assistant', content: ''}}]})
    + chunk({choices: [{index: 0, delta: {content: payload}}], specdec: {tokens}})
    + chunk({choices: [{index: 0, delta: {}, finish_reason: 'stop'}]}) + 'data: [DONE]\\n\\n';
  return new Response(body, {status: 200, headers: {'Content-Type': 'text/event-stream'}});
};
"""


def test_model_output_stays_text(driver, server):
    """An answer (and a prompt) with markup in it: shown as text, nothing of it run."""
    d, s = driver, server
    open_page(d, s)
    evil = ("<script>window.pwned = 1</script> **bold** <img src=x onerror=\"window.pwned = 2\">\n"
            "```html\n<iframe src=\"javascript:window.pwned = 3\"></iframe>\n```\n")
    d.execute_script(SSE_JS, evil)
    fill(d, "prompt", "<b>hi</b><img src=x onerror=\"window.pwned = 4\">")
    by_id(d, "send").click()
    answer = wait(d, "const m = document.querySelector('.msg.assistant');"
                     "return m && m.dataset.state === 'done' && m", 10)
    assert "".join(t for t, _ in d.execute_script(TOKENS_JS, answer)) == evil
    found = d.execute_script("return document.querySelectorAll('#messages script, #messages img, "
                             "#messages iframe, #messages b').length")
    assert found == 0 and d.execute_script("return window.pwned") is None
    assert "<script>" in answer.text and "<b>hi</b>" in by_id(d, "messages").text
    d.refresh()                                             # the real fetch back
    assert httpx.get(s.url + "/health").status_code == 200
