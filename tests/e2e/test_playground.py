"""The browser playground at /playground in a real headless Chromium (tests/support/browser.py) on the
test stack: a chat answer streams in piece by piece and names Paris, an embeddings similarity table and
a rerank order appear. A screenshot of each goes to test-output/playground/ (TRITONGATE_TEST_OUTPUT)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from launcher.stack import LocalStack, http_ok
from tests.support.browser import CHROMIUM_ARGS, chromium
from tests.support.ports import free_port, wait_until
from tests.support.stack import spawn

SMOLLM2 = "smollm2-135m-instruct"
EMBED = "all-minilm-l6-v2"
RERANK = "minilm-rerank"
ROOT = Path(__file__).resolve().parents[2]
KEY = "playground-test-key-5b1e"
SHOTS = Path(os.environ.get("TRITONGATE_TEST_OUTPUT", ROOT / "test-output")) / "playground"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=chromium(), headless=True, args=CHROMIUM_ARGS)
        yield launched
        launched.close()


@pytest.fixture(scope="module")
def page(browser: Any, stack: LocalStack) -> Any:
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.goto(f"{stack.edge_url}/playground")
    page.wait_for_selector(f"#chat-model option[value='{SMOLLM2}']", state="attached")
    return page


def test_the_page_and_its_files_load_offline(http: httpx.Client) -> None:
    html = http.get("/playground").text
    assert "tritongate playground" in html and "http" not in html.split("<body>")[1]  # nothing from elsewhere
    for name, kind in (("playground.js", "text/javascript"), ("playground.css", "text/css")):
        response = http.get(f"/playground/{name}")
        assert response.status_code == 200 and response.headers["content-type"].startswith(kind)
    assert http.get("/playground/other.js").status_code == 404


def test_a_chat_answer_streams_in_and_names_paris(page: Any) -> None:
    page.select_option("#chat-model", SMOLLM2)
    page.fill("#temperature", "0")
    page.fill("#max-tokens", "24")
    # Record every text the answer shows while it streams.
    page.evaluate("""() => {
        window.seen = [];
        new MutationObserver(() => {
            const answers = document.querySelectorAll('.message.assistant');
            if (answers.length) window.seen.push(answers[answers.length - 1].textContent);
        }).observe(document.getElementById('messages'), {subtree: true, childList: true, characterData: true});
    }""")
    page.fill("#prompt", "What is the capital of France?")
    page.click("#send")
    page.wait_for_function("() => !document.getElementById('send').disabled && window.seen.length > 0",
                           timeout=120_000)
    answer = page.locator(".message.assistant").last.text_content()
    seen = page.evaluate("() => window.seen")
    page.screenshot(path=str(SHOTS / "chat.png"), full_page=True)
    assert "Paris" in answer
    growing = [text for text in dict.fromkeys(seen) if text]
    assert len(growing) >= 3 and all(answer.startswith(text) for text in growing)  # piece by piece


def test_embeddings_similarity_shows_related_texts_closer(page: Any) -> None:
    page.select_option("#embed-model", EMBED)
    page.click("#embed-run")
    page.wait_for_selector("#similarity[data-ready='true']", timeout=60_000)
    cells = page.eval_on_selector_all("#similarity tr", "rows => rows.slice(1).map(r => "
                                      "[...r.querySelectorAll('td')].map(c => parseFloat(c.textContent)))")
    page.screenshot(path=str(SHOTS / "embeddings.png"), full_page=True)
    assert len(cells) == 3 and all(abs(cells[i][i] - 1) < 1e-3 for i in range(3))
    assert cells[0][1] > cells[0][2]  # the cat and the kitten, closer than the stock market


def test_rerank_puts_the_answer_first(page: Any) -> None:
    page.select_option("#rerank-model", RERANK)
    page.click("#rerank-run")
    page.wait_for_selector("#ranking[data-ready='true']", timeout=60_000)
    ranking = page.locator("#ranking li").all_text_contents()
    page.screenshot(path=str(SHOTS / "rerank.png"), full_page=True)
    assert len(ranking) == 3 and "Paris is the capital" in ranking[0]


def test_with_api_keys_the_page_asks_for_one(browser: Any, stack: LocalStack, tmp_path: Path) -> None:
    port = free_port()
    address = stack.service_address
    edge = spawn(["edge", "--port", str(port), f"--llm={address('llm')}", f"--embed={address('embed')}",
                  f"--rerank={address('rerank')}"], dict(os.environ, TRITONGATE_API_KEY=KEY), tmp_path / "edge.log")
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: http_ok(f"{url}/health"), 60, "an edge with keys", edge)
        page = browser.new_page()
        page.goto(f"{url}/playground")
        page.wait_for_function("() => document.getElementById('status').textContent.startsWith('models:')")
        assert "API key" in page.text_content("#status")  # the edge's 401 message, shown
        page.fill("#api-key", KEY)
        page.dispatch_event("#api-key", "change")
        page.wait_for_selector(f"#chat-model option[value='{SMOLLM2}']", state="attached")
        page.close()
    finally:
        edge.terminate()
        edge.wait(30)
