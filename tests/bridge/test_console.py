"""The console (`GET /console`) in a real browser: Debian's chromium, driven by Playwright, in front of a
keyed bridge and the session's real vLLM. It logs in, shows the served model, counts requests sent
through the bridge, refuses a wrong key, keeps the API price; a screenshot is kept as an artifact."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, Page, ViewportSize, expect

from runtime.engine import tinymodel as tiny
from tests.support.bench_report import nemotron_on_an_ada
from tests.support.bridge import Process, pod_status, start_bridge
from tests.support.net import free_port
from tests.support.sdk import anthropic
from tests.support.vllm_server import VllmServer

WATCHER, ALICE = "sk-console-watcher-0123456789", "sk-console-alice-0123456789"
SESSION, SUBAGENT = "c0ffee00-1111-4222-8333-444455556666", "a1b2c3d4e5f6a7b8c"
AGENTS = [{}, {}, {"x-claude-code-agent-id": SUBAGENT, "x-claude-code-request-class": "subagent"}]
SENT = len(AGENTS)  # requests alice sends while the page watches
# Claude Code-like: a long system prompt shared by every request, so the later ones hit vLLM's prefix cache
SYSTEM = "You are a coding agent in a terminal: read the instructions, then always answer briefly. " * 8
COST_PER_HOUR = "2.5"
WAIT_MS = 120_000  # the page polls every 2 s; generous for a machine whose cores other suites share
VIEWPORT: ViewportSize = {
    "width": 1200,
    "height": 900,
}  # the screenshot in docs/guide/watch.md (docs/console.png) is taken at this size

expect.set_options(timeout=WAIT_MS)


@pytest.fixture(scope="module")
def watched(vllm_server: VllmServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    root = tmp_path_factory.mktemp("console")
    settings = {
        "VL_API_KEYS": f"watcher:{WATCHER}:1Mtokens/month, alice:{ALICE}",  # the admin's budget: its row's Budget
        "VL_STATE_DIR": str(root / "state"),
        "VL_COST_PER_HOUR": COST_PER_HOUR,
    }
    with start_bridge(vllm_server.url, root / "bridge.log", settings) as bridge:
        yield bridge


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    """A fresh browser context (its own localStorage), the CSP violations it reports collected."""
    context = browser.new_context(viewport=VIEWPORT)
    opened = context.new_page()
    violations: list[str] = []
    opened.on(
        "console",
        lambda message: violations.append(message.text) if "Content Security Policy" in message.text else None,
    )
    yield opened
    context.close()
    assert not violations, f"the page broke its own Content-Security-Policy: {violations}"


def log_in(page: Page, url: str, key: str) -> None:
    page.goto(f"{url}/console")
    expect(page.get_by_test_id("login")).to_be_visible()
    page.get_by_test_id("key-input").fill(key)
    page.get_by_test_id("key-submit").click()


def keep_screenshot(page: Page, artifacts: Path) -> None:
    """The test's artifact; also at CONSOLE_SCREENSHOT when set (how docs/console.png is made)."""
    page.screenshot(path=artifacts / "console.png", full_page=True)
    if target := os.environ.get("CONSOLE_SCREENSHOT"):
        page.screenshot(path=target, full_page=True)


def test_the_page_needs_no_key_and_locks_itself_down(watched: Process) -> None:
    response = httpx.get(f"{watched.url}/console")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/html")
    policy = response.headers["content-security-policy"]
    assert "default-src 'none'" in policy and "frame-ancestors 'none'" in policy and "connect-src 'self'" in policy
    assert "unsafe-inline" not in policy and "unsafe-eval" not in policy
    assert response.headers["x-frame-options"] == "DENY"
    assert response.headers["referrer-policy"] == "no-referrer"
    assert response.headers["x-content-type-options"] == "nosniff"
    refused = httpx.get(f"{watched.url}/v1/pod/status")
    assert refused.status_code == 401 and refused.json()["error"]["type"] == "authentication_error"
    assert "GET /console" not in watched.log()  # quiet in the trace, like /health


def test_logged_in_it_shows_the_model_and_counts_requests(
    watched: Process, vllm_server: VllmServer, page: Page, tmp_path: Path
) -> None:
    urls: list[str] = []
    page.on("request", lambda request: urls.append(request.url))
    kept = httpx.put(f"{watched.url}/v1/pod/bench", headers={"x-api-key": WATCHER}, json=nemotron_on_an_ada())
    assert kept.status_code == 204  # `runtime bench`'s report, sent with the admin's key
    log_in(page, watched.url, WATCHER)
    expect(page.get_by_test_id("model")).to_have_text(vllm_server.model)
    expect(page.get_by_test_id("bench")).to_have_text(
        re.compile(
            r"^Last bench \(\d{4}-\d\d-\d\dT[\d:]+Z\): solo 199\.4 tok/s at 3,050 tokens, 8 sessions 583\.2 tok/s, "
            r"prefill 21,333\.3 tok/s cold, 0\.95 of the notes' solo on an RTX 6000 Ada\.$"
        )
    )
    expect(page.get_by_test_id("console")).to_be_visible()
    assert f"{watched.url}/v1/pod/status" in urls and not any(WATCHER in url for url in urls)  # a header, never a URL
    alice_row = page.locator('[data-testid="key-row"][data-key="alice"]')
    expect(alice_row).to_have_count(0)  # alice has sent nothing yet
    budget = page.locator('[data-testid="key-row"][data-key="watcher"]').get_by_test_id("key-budget")
    expect(budget).to_have_text(re.compile(r"^0\.0 % of 1,000,000 tokens a month \(resets \d{4}-\d\d-01\)$"))
    before = int((page.get_by_test_id("request-count").text_content() or "").replace(",", ""))

    client = anthropic.Anthropic(base_url=watched.url, api_key=ALICE, max_retries=0)
    for agent in AGENTS:  # one Claude Code session: its main agent twice, then a subagent it started
        answer = client.messages.create(
            model="claude-tiny", max_tokens=20, system=SYSTEM, messages=[{"role": "user", "content": tiny.MARK_TEXT}],
            extra_headers={"x-claude-code-session-id": SESSION} | agent,
        )  # fmt: skip
        block = answer.content[0]
        assert block.type == "text" and block.text == tiny.ANSWER

    expect(alice_row.get_by_test_id("key-requests")).to_have_text(str(SENT))
    expect(alice_row.get_by_test_id("key-output-tokens")).to_have_text(re.compile(r"^[1-9][\d,]*$"))
    expect(alice_row.get_by_test_id("key-input-tokens")).to_have_text(re.compile(r"^[1-9][\d,]*$"))
    # the later requests find the shared system prompt in vLLM's prefix cache
    expect(alice_row.get_by_test_id("key-cached-tokens")).to_have_text(re.compile(r"^[1-9][\d,]*$"))
    expect(page.get_by_test_id("cache-hit")).not_to_have_text(re.compile(r"^(0\.0 %|—)"))
    page.wait_for_function(  # the total, all keys together, has grown by what alice sent
        "total => Number(document.querySelector('[data-testid=request-count]').textContent.replace(/,/g, '')) >= total",
        arg=before + SENT,
        timeout=WAIT_MS,
    )
    expect(page.get_by_test_id("cost-per-hour")).to_have_text("$2.50 / h")
    # the capacity panel: real vLLM's own metrics, sampled by the bridge (alice's requests have ended)
    expect(page.get_by_test_id("capacity-verdict")).to_have_text(re.compile(r"^(idle|decoding: \d+ streams.*)$"))
    expect(page.get_by_test_id("kv-use")).to_have_text(re.compile(r"^\d+\.\d %$"))
    agents = page.locator(f'[data-testid="agent-row"][data-session="{SESSION}"]')
    expect(agents).to_have_count(2)
    main, helper = agents.nth(0), agents.nth(1)
    expect(main.get_by_test_id("agent-name")).to_have_text("main")
    expect(main.get_by_test_id("agent-requests")).to_have_text("2")
    expect(helper.get_by_test_id("agent-name")).to_have_text(f"\u2514 {SUBAGENT} (of main)")
    expect(helper.get_by_test_id("agent-requests")).to_have_text("1")
    for row in (main, helper):
        expect(row.get_by_test_id("agent-output-tokens")).to_have_text(re.compile(r"^[1-9][\d,]*$"))
        expect(row.get_by_test_id("agent-cost")).to_have_text(re.compile(r"^\$0\.\d{4}$"))
    expect(helper.get_by_test_id("agent-hit")).not_to_have_text(re.compile(r"^(0\.0 %|—)"))  # the main's prefix

    shown = pod_status(watched.url, WATCHER)  # what the machine has: GPUs, or the note that says there are none
    if shown["gpus"]:
        expect(page.get_by_test_id("gpu")).to_have_count(len(shown["gpus"]))
    else:
        expect(page.get_by_test_id("gpu-note")).to_have_text(shown["gpu_note"] or "No GPU on this machine.")
    keep_screenshot(page, tmp_path)


def test_a_wrong_key_shows_the_refusal(watched: Process, page: Page) -> None:
    log_in(page, watched.url, "sk-not-a-key-of-this-pod-000")
    expect(page.get_by_test_id("refusal")).to_have_text("Refused: invalid API key")
    expect(page.get_by_test_id("login")).to_be_visible()
    expect(page.get_by_test_id("console")).to_be_hidden()
    assert page.evaluate("localStorage.length") == 0  # a refused key is not kept


def test_the_key_and_the_api_price_are_kept_until_forgotten(watched: Process, page: Page) -> None:
    log_in(page, watched.url, WATCHER)
    expect(page.get_by_test_id("console")).to_be_visible()
    page.get_by_test_id("api-price").fill("10")
    # $2.50 an hour against $10 per million output tokens: the same cost at 69.4 output tokens/s
    expect(page.get_by_test_id("break-even")).to_have_text("69 output tokens/s")

    page.reload()
    expect(page.get_by_test_id("console")).to_be_visible()  # no prompt: the key was kept
    expect(page.get_by_test_id("api-price")).to_have_value("10")

    page.get_by_test_id("forget-key").click()
    expect(page.get_by_test_id("login")).to_be_visible()
    expect(page.get_by_test_id("refusal")).to_be_hidden()
    assert page.evaluate("localStorage.getItem('vllm-pod.console.key')") is None
    page.reload()
    expect(page.get_by_test_id("login")).to_be_visible()


def test_with_several_engines_it_lists_each_and_says_degraded_when_one_is_down(
    vllm_server: VllmServer, page: Page, tmp_path: Path
) -> None:
    """The bridge of a pod of two engines (`--engine`, as the pod starts it), the second one down."""
    down = f"http://127.0.0.1:{free_port()}"  # nothing listens there: an engine that died
    settings = {"VL_API_KEYS": f"watcher:{WATCHER}", "VL_STATE_DIR": str(tmp_path / "state")}
    options = ("--engine", vllm_server.url, "--engine", down)
    with start_bridge(vllm_server.url, tmp_path / "bridge.log", settings, *options) as bridge:
        log_in(page, bridge.url, WATCHER)
        expect(page.get_by_test_id("engine-state")).to_have_text("degraded")
        engines = page.get_by_test_id("engines").locator("li")
        expect(engines).to_have_count(2)
        expect(engines.nth(0)).to_contain_text(re.compile(r"engine 0: healthy running \d+, waiting \d+, KV"))
        expect(engines.nth(1)).to_have_text("engine 1: down")
