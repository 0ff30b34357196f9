"""The /ui playground in a real headless Chromium (Debian's chromium + chromedriver, driven by
Selenium) against the whole in-process application with API keys on: ask for the key, upload
files, ask a question, read the streamed answer (Markdown rendered, HTML inert) and its sources
and evidence, example questions, copy and regenerate, browse and filter documents, see the
settings. Screenshots land in the test's folder, and in docs/img/ with
RAGSERVE_UPDATE_SCREENSHOTS=1 (how the README's pictures are made).

The upstream model is the fake OpenAI server, whose answer depends on the question (a Markdown
answer, a hostile one...); every question asked is one the indexed documents answer (it shares
their words), so the server's answerability rule lets it through to the model whatever its exact
thresholds. The evidence of an answer (``rag.evidence``, the contract in ragserve/api/openai.py
``RagInfo`` and ragserve/api/documents.py ``Evidence``) is the server's own: :class:`ChatRecorder`
keeps what each chat stream sent, unchanged, and the tests check that the page shows those
passages and highlights each where its offsets (code points) say in its source, whichever passages
the server chose."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from ragserve.testing.fake_openai import FakeOpenAI
from tests.filemakers import make_pdf
from tests.live_server import serve

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
REPO = Path(__file__).resolve().parents[2]
KEY = "sk-playground-test"
ANSWER = "Line 3's pump is serviced every week by the night shift [1]."
FACT = "Line 3's pump is serviced every week by the night shift."  # the sentence that answers QUESTION
# The questions asked: each shares its key words with the document that answers it (below, `guide`).
QUESTION = "How often is the pump of line 3 serviced?"
MARKDOWN_QUESTION = "How is the pump of line 3 serviced?"
HOSTILE_QUESTION = "Where do visitors sign in?"
REGENERATE_QUESTION = "When are the seals replaced?"
FOLLOW_UP_QUESTION = "And when are the valves locked out?"
MARKDOWN_ANSWER = """**Servicing** the pump takes *three* steps:

1. Stop line 3 with `pumpctl stop`.
2. Replace the **seals** [1].
3. Start it again.

You need:
- gloves
- goggles

```sh
pumpctl stop --line 3 && echo "<b>done</b>"
```
See [the manual](https://example.com/manual?page=3) for the rest."""
HOSTILE_ANSWER = """<script>window.__xss = 1</script> <img src=x onerror="window.__xss = 2">
[click me](javascript:window.__xss=3) and <a href="javascript:window.__xss=4">this</a> **<b>bold</b>**"""
HOSTILE_TITLE = '<img src=x onerror="window.__xss = 5"><script>window.__xss = 6</script>'

pytestmark = pytest.mark.skipif(
    not (CHROMIUM and CHROMEDRIVER),
    reason="needs Debian's chromium and chromium-driver: run scripts/ensure-chromium.sh (make install does)",
)


def fake_answer(attempts: dict[str, int]) -> Any:
    """The fake model's answer to a request: chosen by the question (the last message)."""

    def answer(body: dict[str, Any]) -> str:
        asked = str(body["messages"][-1].get("content", "")).strip()
        if asked == MARKDOWN_QUESTION:
            return MARKDOWN_ANSWER
        if asked == HOSTILE_QUESTION:
            return HOSTILE_ANSWER
        if asked == REGENERATE_QUESTION:
            attempts["regenerate"] = attempts.get("regenerate", 0) + 1
            return f"**Attempt {attempts['regenerate']}**: the seals are replaced every quarter [1]."
        return ANSWER

    return answer


class ChatRecorder:
    """ASGI middleware over the application that passes every byte as the server sent it and keeps,
    for each chat completion (in ``chats``, the newest last), what its stream said of the answer:
    ``source_nodes`` (first chunk) and ``rag`` (the newest one sent: the final chunk's)."""

    def __init__(self, app: Any):
        self.app = app
        self.chats: list[SimpleNamespace] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not scope["path"].endswith("/v1/chat/completions"):
            await self.app(scope, receive, send)
            return
        body = bytearray()

        async def recording(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.body":
                body.extend(message.get("body", b""))
                if not message.get("more_body", False):
                    self.chats.append(self._read(bytes(body)))
            await send(message)

        await self.app(scope, receive, recording)

    @staticmethod
    def _read(body: bytes) -> SimpleNamespace:
        chat = SimpleNamespace(source_nodes=None, rag=None)
        for event in body.split(b"\n\n"):
            if not event.startswith(b"data: {"):
                continue
            chunk = json.loads(event[len(b"data: ") :])
            if chunk.get("source_nodes") and chat.source_nodes is None:
                chat.source_nodes = chunk["source_nodes"]
            if isinstance(chunk.get("rag"), dict):
                chat.rag = chunk["rag"]
        return chat


@pytest.fixture(scope="module")
def live(tmp_path_factory, embedding_model) -> Iterator[SimpleNamespace]:
    from ragserve.testing.embedder import InProcessEmbedder
    from ragserve.testing.inprocess import inprocess_app

    attempts: dict[str, int] = {}
    with (
        FakeOpenAI(answer=fake_answer(attempts), model="fake-model", max_model_len=4096) as fake,
        inprocess_app(
            tmp_path_factory.mktemp("ui"),
            InProcessEmbedder(embedding_model),
            fake.url,
            similarity_threshold=0.0,
            api_keys=[KEY],
        ) as (app, _),
        serve(recorder := ChatRecorder(app)) as url,
    ):
        auth = {"Authorization": f"Bearer {KEY}"}
        assert httpx.get(f"{url}/health").status_code == 200
        guide = [
            {
                "text": "Maintenance notes (pressure \U0001d45d under 6 bar). " + FACT + " The seals are replaced "
                "every quarter.",
                "metadata": {"title": "Pump servicing", "path": "guide/pumps.md"},
            },
            {"text": "Visitors sign in at the front desk.", "metadata": {"title": HOSTILE_TITLE}},
            {"text": "Valves are locked out before any repair.", "metadata": {"title": "Valve lockout"}},
        ]
        r = httpx.post(f"{url}/index", json={"index_name": "guide", "documents": guide}, headers=auth, timeout=60)
        assert r.status_code == 200, r.text
        yield SimpleNamespace(url=url, fake=fake, chats=recorder.chats)


@pytest.fixture(scope="module")
def app_url(live: SimpleNamespace) -> str:
    return live.url


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1280,860",
        "--no-first-run",
        "--disable-extensions",
    ):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)  # no driver download: Debian's
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def shot(driver, name: str, tmp_path: Path) -> None:
    driver.save_screenshot(str(tmp_path / name))
    if os.environ.get("RAGSERVE_UPDATE_SCREENSHOTS") == "1":
        (REPO / "docs" / "img").mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(REPO / "docs" / "img" / name))


def open_chat(d, app_url: str, index: str = "guide"):
    """The playground with the key given, `index` selected, on an empty chat; returns a wait."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    wait = WebDriverWait(d, 30)
    d.get(f"{app_url}/ui/")
    d.execute_script("sessionStorage.setItem('ragserve.apiKey', arguments[0])", KEY)
    d.refresh()
    wait.until(lambda _: d.find_element(By.TAG_NAME, "body").get_attribute("data-ready") == "true")
    select = Select(d.find_element(By.ID, "index-select"))
    if select.first_selected_option.get_attribute("value") != index:
        select.select_by_value(index)
    d.find_element(By.CSS_SELECTOR, '[data-tab="chat"]').click()
    if not d.find_element(By.ID, "opt-rag").is_selected():
        d.find_element(By.ID, "opt-rag").click()
    d.find_element(By.ID, "chat-clear").click()
    return wait


def ask(d, wait, question: str):
    """Asks in the chat box and returns the answer's element once it is done."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    done = len(d.find_elements(By.CSS_SELECTOR, ".msg.assistant.done"))
    box = d.find_element(By.ID, "chat-input")
    box.send_keys(question)
    box.send_keys(Keys.ENTER)
    wait.until(lambda _: len(d.find_elements(By.CSS_SELECTOR, ".msg.assistant.done")) > done)
    return d.find_elements(By.CSS_SELECTOR, ".msg.assistant.done")[-1]


def evidence_shown(reply) -> list[tuple[int, str]]:
    """The evidence listed under an answer: (the source its [n] cites, the passage), in order."""
    from selenium.webdriver.common.by import By

    return [
        (
            int(li.find_element(By.CSS_SELECTOR, "a.cite").get_attribute("data-source")),
            li.find_element(By.TAG_NAME, "q").get_attribute("textContent"),
        )
        for li in reply.find_elements(By.CSS_SELECTOR, ".evidence li")
    ]


def marked(snippet) -> list[str]:
    """The passages highlighted in a source's text, in order (as their text, not as laid out)."""
    from selenium.webdriver.common.by import By

    return [m.get_attribute("textContent") for m in snippet.find_elements(By.TAG_NAME, "mark")]


def test_upload_ask_and_browse_in_a_real_browser(browser, app_url: str, live, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import Select, WebDriverWait

    d = browser
    wait = WebDriverWait(d, 30)
    d.get(f"{app_url}/ui")  # the page itself needs no key...
    assert d.current_url.endswith("/ui/") and d.title == "ragserve playground"
    dialog = wait.until(ec.visibility_of_element_located((By.ID, "key-dialog")))  # ...its API calls do
    assert "Missing API key" in dialog.text
    d.find_element(By.ID, "key-input").send_keys(KEY)
    d.find_element(By.ID, "key-save").click()
    wait.until(lambda _: d.find_element(By.TAG_NAME, "body").get_attribute("data-ready") == "true")
    assert "fake-model" in d.find_element(By.ID, "model-name").text
    # the key is kept for this tab only: "remember" was not ticked (and the page ran under its CSP)
    assert d.execute_script("return sessionStorage.getItem('ragserve.apiKey')") == KEY
    assert d.execute_script("return localStorage.getItem('ragserve.apiKey')") is None

    # upload a markdown file and a two-page PDF into a new index
    files = tmp_path / "files"
    files.mkdir()
    (files / "pumps.md").write_text(
        "# Pump servicing\n\nLine 3's pump is serviced every week by the night shift.\n"
        "The seals are replaced every quarter.\n"
    )
    (files / "safety.pdf").write_bytes(make_pdf(["Wear gloves near the pumps.", "Lock out the valves first."]))
    d.find_element(By.CSS_SELECTOR, '[data-tab="upload"]').click()
    field = d.find_element(By.ID, "upload-index")
    field.clear()
    field.send_keys("handbook")
    d.find_element(By.ID, "upload-files").send_keys(f"{files / 'pumps.md'}\n{files / 'safety.pdf'}")
    wait.until(lambda _: len(d.find_elements(By.CSS_SELECTOR, "#upload-log li.ok")) == 2)
    log = d.find_element(By.ID, "upload-log").text
    assert "safety.pdf: 2 document(s) indexed as pdf" in log and "pumps.md: 1 document(s) indexed as markdown" in log
    wait.until(lambda _: Select(d.find_element(By.ID, "index-select")).first_selected_option.text == "handbook")
    wait.until(lambda _: "3 documents" in d.find_element(By.ID, "index-stats").text)

    # an empty chat offers questions made from the index's titles
    d.find_element(By.CSS_SELECTOR, '[data-tab="chat"]').click()
    wait.until(lambda _: "Pump servicing" in d.find_element(By.ID, "messages").text)
    shot(d, "ui-examples.png", tmp_path)

    # ask: the answer streams in, with the RAG badge, the sources and their scores, and the evidence
    box = d.find_element(By.ID, "chat-input")
    box.send_keys(QUESTION)
    box.send_keys(Keys.ENTER)
    reply = wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, ".msg.assistant.done")))
    sent = live.chats[-1]  # what the server's stream said: its sources and evidence
    assert reply.find_element(By.CSS_SELECTOR, ".body").text == ANSWER
    assert reply.find_element(By.CSS_SELECTOR, ".badge").text == "rag"
    sources = reply.find_elements(By.CSS_SELECTOR, ".sources li summary")
    assert sources and sources[0].text.startswith("Pump servicing — uploads/pumps.md")
    assert all("(score " in s.text for s in sources)
    assert any("uploads/safety.pdf p." in s.text for s in sources)
    sources[0].click()  # a source opens to the chunk that was retrieved
    snippet = reply.find_element(By.CSS_SELECTOR, ".sources li .snippet")
    wait.until(lambda _: snippet.is_displayed())
    assert "serviced every week by the night shift" in snippet.text
    # the evidence the server sent: listed under the answer, and highlighted in the pump notes' text
    evidence = sent.rag["evidence"]
    assert evidence and reply.find_element(By.CSS_SELECTOR, ".evidence").is_displayed()
    assert evidence_shown(reply) == [(ev["source"], ev["text"]) for ev in evidence]
    in_first = sorted((ev for ev in evidence if ev["source"] == 1), key=lambda ev: ev["start"])
    assert in_first, evidence  # the best source holds evidence for a question it answers
    assert marked(snippet) == [ev["text"] for ev in in_first]
    shot(d, "ui.png", tmp_path)

    # no index: the answer says it was a passthrough and why
    d.find_element(By.ID, "opt-rag").click()
    box.send_keys("hello")
    box.send_keys(Keys.ENTER)
    wait.until(lambda _: len(d.find_elements(By.CSS_SELECTOR, ".msg.assistant.done")) == 2)
    meta = d.find_elements(By.CSS_SELECTOR, ".msg.assistant.done .meta")[-1].text
    assert "passthrough" in meta and "reason: no_index" in meta

    # browse and filter documents
    d.find_element(By.CSS_SELECTOR, '[data-tab="documents"]').click()
    wait.until(lambda _: "of 3" in d.find_element(By.ID, "docs-page").text)
    flt = d.find_element(By.ID, "docs-filter")
    flt.send_keys('{"file_type": "pdf"}')
    flt.send_keys(Keys.ENTER)
    wait.until(lambda _: "of 2" in d.find_element(By.ID, "docs-page").text)
    ids = [c.text for c in d.find_elements(By.CSS_SELECTOR, "#docs-table tbody td:first-child")]
    assert ids == ["uploads/safety.pdf#p1", "uploads/safety.pdf#p2"]
    shot(d, "ui-documents.png", tmp_path)

    # the settings in force, never a key
    d.find_element(By.CSS_SELECTOR, '[data-tab="settings"]').click()
    table = wait.until(ec.visibility_of_element_located((By.ID, "settings-table")))
    wait.until(lambda _: "faiss_index_kind" in table.text)
    assert "API keys required yes" in table.text and "limit: max_documents_per_request 1000" in table.text
    assert KEY not in table.text and KEY not in d.page_source


def test_markdown_answers_render_as_formatting(browser, app_url: str, live, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    d = browser
    wait = open_chat(d, app_url)
    d.find_element(By.ID, "opt-filter").send_keys("path=guide/pumps.md")  # one source: the pump notes
    # what the answer looks like while it streams (a word every 30 ms)
    d.execute_script(
        """window.__streamed = [];
        new MutationObserver(() => {
          const body = document.querySelector('.msg.assistant.streaming .body');
          if (body) window.__streamed.push([body.querySelectorAll('strong, li').length, body.textContent.length]);
        }).observe(document.getElementById('messages'), {subtree: true, childList: true, characterData: true});"""
    )
    live.fake.chunk_delay_s = 0.03
    try:
        reply = ask(d, wait, MARKDOWN_QUESTION)
    finally:
        live.fake.chunk_delay_s = 0.0
    body = reply.find_element(By.CSS_SELECTOR, ".body")
    assert "**" not in body.text and "```" not in body.text and "](" not in body.text
    assert [e.text for e in body.find_elements(By.CSS_SELECTOR, "strong")] == ["Servicing", "seals"]
    assert [e.text for e in body.find_elements(By.CSS_SELECTOR, "em")] == ["three"]
    steps = body.find_elements(By.CSS_SELECTOR, "ol > li")  # a numbered list is a list
    assert [s.text for s in steps] == ["Stop line 3 with pumpctl stop.", "Replace the seals [1].", "Start it again."]
    assert steps[0].find_element(By.TAG_NAME, "code").text == "pumpctl stop"
    assert [li.text for li in body.find_elements(By.CSS_SELECTOR, "ul > li")] == ["gloves", "goggles"]
    assert body.find_element(By.CSS_SELECTOR, "pre code").text == 'pumpctl stop --line 3 && echo "<b>done</b>"'
    assert not body.find_elements(By.CSS_SELECTOR, "pre b")  # code is text
    link = body.find_element(By.CSS_SELECTOR, "a:not(.cite)")
    assert link.text == "the manual" and link.get_attribute("href") == "https://example.com/manual?page=3"
    assert link.get_attribute("rel") == "noopener noreferrer" and link.get_attribute("target") == "_blank"
    # the citation stays visible and opens its source
    cite = body.find_element(By.CSS_SELECTOR, "a.cite")
    assert cite.text == "[1]"
    sources = reply.find_elements(By.CSS_SELECTOR, ".sources li details")
    assert len(sources) == 1 and sources[0].get_attribute("open") is None
    cite.click()
    wait.until(lambda _: sources[0].get_attribute("open") is not None)
    assert d.current_url.endswith("/ui/")  # the citation did not navigate
    # it was rendered as it streamed, not only at the end
    final = len(d.execute_script("return arguments[0].textContent", body))
    streamed = d.execute_script("return window.__streamed")
    assert any(formatted and 0 < length < final for formatted, length in streamed), streamed[-5:]
    shot(d, "ui-markdown.png", tmp_path)


def test_html_in_an_answer_or_a_title_is_inert_text(browser, app_url: str) -> None:
    from selenium.webdriver.common.by import By

    d = browser
    wait = open_chat(d, app_url)
    examples = wait.until(lambda _: d.find_elements(By.CSS_SELECTOR, "#examples button.example"))
    assert any(HOSTILE_TITLE in b.text for b in examples)  # the title, shown as its text
    reply = ask(d, wait, HOSTILE_QUESTION)
    assert "not-covered" not in reply.get_attribute("class")  # the model's answer, shown
    body = reply.find_element(By.CSS_SELECTOR, ".body")
    assert '<script>window.__xss = 1</script> <img src=x onerror="window.__xss = 2">' in body.text
    assert "[click me](javascript:window.__xss=3)" in body.text and "<b>bold</b>" in body.text
    messages = d.find_element(By.ID, "messages")
    assert not messages.find_elements(By.CSS_SELECTOR, "script, img, b, [onerror]")
    assert not d.find_elements(By.CSS_SELECTOR, 'a[href^="javascript:" i]')
    assert body.find_element(By.TAG_NAME, "strong").text == "<b>bold</b>"
    sources = [s.text for s in reply.find_elements(By.CSS_SELECTOR, ".sources li summary")]
    assert any(s.startswith(HOSTILE_TITLE) for s in sources), sources  # a source's title too
    d.find_element(By.CSS_SELECTOR, '[data-tab="documents"]').click()  # titles in the documents table too
    wait.until(lambda _: any(td.text == HOSTILE_TITLE for td in d.find_elements(By.CSS_SELECTOR, "#docs-table td")))
    assert d.execute_script("return window.__xss") is None


def test_example_questions_on_an_empty_chat_ask_when_clicked(browser, app_url: str, live) -> None:
    from selenium.webdriver.common.by import By

    d = browser
    wait = open_chat(d, app_url)
    examples = wait.until(lambda _: d.find_elements(By.CSS_SELECTOR, "#examples button.example"))
    texts = [b.text for b in examples]
    assert len(texts) == 3 and any("Pump servicing" in t for t in texts) and any("Valve lockout" in t for t in texts)
    assert "guide" in d.find_element(By.ID, "examples").text
    pump = next(b for b in examples if "Pump servicing" in b.text)
    question = pump.text
    pump.click()
    reply = wait.until(lambda _: d.find_elements(By.CSS_SELECTOR, ".msg.assistant.done"))[0]
    assert d.find_element(By.CSS_SELECTOR, ".msg.user").text == question
    assert "not-covered" not in reply.get_attribute("class")  # an example the documents answer
    assert reply.find_element(By.CSS_SELECTOR, ".body").text == ANSWER
    assert live.fake.requests[-1]["messages"][-1]["content"] == question
    assert not d.find_elements(By.ID, "examples")  # gone once the chat has started
    d.find_element(By.ID, "chat-clear").click()  # a new chat shows them again
    wait.until(lambda _: d.find_elements(By.CSS_SELECTOR, "#examples button.example"))
    assert not d.find_elements(By.CSS_SELECTOR, ".msg")


def test_copy_and_regenerate_the_answer(browser, app_url: str, live) -> None:
    from selenium.webdriver.common.by import By

    d = browser
    wait = open_chat(d, app_url)
    d.execute_cdp_cmd(
        "Browser.grantPermissions",
        {"origin": app_url, "permissions": ["clipboardReadWrite", "clipboardSanitizedWrite"]},
    )
    reply = ask(d, wait, REGENERATE_QUESTION)
    assert reply.find_element(By.CSS_SELECTOR, ".body strong").text == "Attempt 1"
    reply.find_element(By.CSS_SELECTOR, ".actions .copy").click()
    wait.until(lambda _: "Copied" in reply.find_element(By.CSS_SELECTOR, ".actions .copy").text)
    copied = d.execute_async_script("navigator.clipboard.readText().then(arguments[0], (e) => arguments[0]('' + e))")
    assert copied == "**Attempt 1**: the seals are replaced every quarter [1]."  # the answer's own text
    before = live.fake.requests[-1]["messages"]

    reply.find_element(By.CSS_SELECTOR, ".actions .regenerate").click()
    wait.until(lambda _: "Attempt 2" in d.find_element(By.CSS_SELECTOR, ".msg.assistant.done .body").text)
    assert len(d.find_elements(By.CSS_SELECTOR, ".msg.assistant")) == 1  # replaced, not added
    assert len(d.find_elements(By.CSS_SELECTOR, ".msg.user")) == 1
    assert live.fake.requests[-1]["messages"] == before  # the same question, the same conversation

    # the conversation goes on from the new answer; only the newest answer can be regenerated
    follow_up = ask(d, wait, FOLLOW_UP_QUESTION)
    assert follow_up.find_element(By.CSS_SELECTOR, ".body").text == ANSWER
    assert live.fake.requests[-1]["messages"][-2]["content"].startswith("**Attempt 2**")  # the answer kept
    answers = d.find_elements(By.CSS_SELECTOR, ".msg.assistant.done")
    assert not answers[0].find_elements(By.CSS_SELECTOR, ".regenerate") and answers[0].find_elements(
        By.CSS_SELECTOR, ".copy"
    )
    assert answers[1].find_elements(By.CSS_SELECTOR, ".regenerate")


def test_evidence_is_shown_and_highlighted_in_its_source(browser, app_url: str, live) -> None:
    from selenium.webdriver.common.by import By

    d = browser
    wait = open_chat(d, app_url)
    reply = ask(d, wait, QUESTION)
    sent = live.chats[-1]  # the sources and evidence the server sent, whichever passages it chose
    evidence, nodes = sent.rag["evidence"], sent.source_nodes
    box = reply.find_element(By.CSS_SELECTOR, ".evidence")
    assert box.is_displayed() and evidence_shown(reply) == [(ev["source"], ev["text"]) for ev in evidence]
    # a passage of the pump notes (their text has a 𝑝, two UTF-16 units, where the server counts one)
    pump = [k for k, ev in enumerate(evidence) if nodes[ev["source"] - 1]["metadata"].get("title") == "Pump servicing"]
    assert pump, evidence  # the notes that answer the question hold evidence
    k = pump[0]
    ev = evidence[k]
    source = reply.find_elements(By.CSS_SELECTOR, ".sources > li")[ev["source"] - 1]
    assert "Pump servicing" in source.text and "evidence" in source.find_element(By.TAG_NAME, "summary").text
    box.find_elements(By.CSS_SELECTOR, "li")[k].find_element(By.CSS_SELECTOR, "a.cite").click()  # opens the source
    mark = source.find_element(By.CSS_SELECTOR, f'.snippet mark[data-evidence="{k}"]')
    wait.until(lambda _: mark.is_displayed())
    assert "flash" in mark.get_attribute("class")  # at the passage
    assert mark.get_attribute("textContent") == ev["text"]
    # where its offsets say: after the source's first `start` characters (code points, past the 𝑝)
    before = d.execute_script(
        "const r = document.createRange(); r.setStart(arguments[0].parentNode, 0); r.setEndBefore(arguments[0]);"
        "return r.toString();",
        mark,
    )
    node_text = nodes[ev["source"] - 1]["text"]
    assert before == node_text[: ev["start"]] and ev["text"] == node_text[ev["start"] : ev["end"]]
    snippet = source.find_element(By.CSS_SELECTOR, ".snippet")
    assert snippet.get_attribute("textContent") == node_text  # the whole source, marks and all
    assert snippet.text.startswith("Maintenance notes (pressure \U0001d45d") and snippet.text.endswith("every quarter.")
    # offsets are code points (the server's characters), not UTF-16 units; a passage found twice is
    # marked where its offsets say
    assert d.execute_script("return unitRange('\U0001f527ab', 1, 3)") == [2, 4]
    assert d.execute_script("return evidenceRange('a. \U0001f527 a.', {text: 'a.', start: 5, end: 7})") == [6, 8]
    assert d.execute_script("return evidenceRange('x a.', {text: 'a.', start: 9, end: 11})") == [2, 4]  # found
    assert d.execute_script("return evidenceRange('x', {text: 'a.', start: 0, end: 2})") is None


def test_an_answer_the_documents_do_not_cover_is_a_note(browser, app_url: str) -> None:
    from selenium.webdriver.common.by import By

    d = browser
    wait = open_chat(d, app_url)
    reply = ask(d, wait, "How far away is the moon?")
    assert "not-covered" in reply.get_attribute("class")
    note = reply.find_element(By.CSS_SELECTOR, ".note")
    assert note.is_displayed() and "Not covered" in note.text
    assert reply.find_elements(By.CSS_SELECTOR, ".sources li")  # the closest sources, still listed
    covered = ask(d, wait, QUESTION)
    assert "not-covered" not in covered.get_attribute("class")
    assert not covered.find_element(By.CSS_SELECTOR, ".note").is_displayed()


def test_favicon_in_the_browser(browser, app_url: str) -> None:
    d = browser
    open_chat(d, app_url)
    found = d.execute_async_script(
        """const done = arguments[0];
        const icon = document.querySelector('link[rel="icon"]').href;
        Promise.all([fetch(icon), fetch('/favicon.ico')]).then(
          (rs) => done(rs.map((r) => [r.status, r.headers.get('content-type')])), (e) => done(String(e)));"""
    )
    assert found == [[200, "image/svg+xml"], [200, "image/vnd.microsoft.icon"]]


def test_markdown_rendering_is_linear_on_a_megabyte_of_the_worst_shapes(browser, app_url: str) -> None:
    """1 MB answers made of what a parser may backtrack or nest on: each is parsed and built into
    the page in well under a second, and none builds more than the renderer's element budget.
    Laying out a megabyte of text is Chromium's work, the same for the text shown plain: it is
    printed beside the render time, not asserted."""
    d = browser
    open_chat(d, app_url)
    results = d.execute_script(
        """const N = 1 << 20;
        const shapes = {
          stars: '*'.repeat(N), backticks: '`'.repeat(N), brackets: '['.repeat(N), underscores: '_'.repeat(N),
          starWord: '*a'.repeat(N / 2), wordStar: 'a*'.repeat(N / 2), strong: '**a'.repeat(N / 3),
          under: '_a '.repeat(N / 3), crossed: '*a _b '.repeat(N / 6),
          nested: '*a '.repeat(N / 6) + 'a* '.repeat(N / 6),
          codeSpans: '` '.repeat(N / 2), codeRuns: '``a`'.repeat(N / 4), links: '[a]('.repeat(N / 4),
          linkPairs: '[a](https:'.repeat(N / 10), citations: '[1]'.repeat(N / 3), citationLists: '[1,'.repeat(N / 3),
          urls: 'http://%'.repeat(N / 8), lines: '- a\\n'.repeat(N / 4), indents: '  '.repeat(N / 2) + '- a',
          deepList: Array.from({length: 1000}, (_, k) => ' '.repeat(2 * k) + '- a').join('\\n'),
          fences: '```\\n'.repeat(N / 4), headings: '# '.repeat(N / 2), quotes: '> '.repeat(N / 2),
          newlines: '\\n'.repeat(N), crlf: 'a\\r\\n'.repeat(N / 3),
        };
        const box = document.createElement('div');
        box.className = 'md';
        document.body.append(box);
        const out = {};
        for (const [name, text] of Object.entries(shapes)) {
          const t0 = performance.now();
          Markdown.render(text, box, {sources: 3});
          const t1 = performance.now();
          box.offsetHeight;
          const t2 = performance.now();
          out[name] = [t1 - t0, t2 - t1, box.getElementsByTagName('*').length, text.length];
          box.replaceChildren();
        }
        box.remove();
        return out;"""
    )
    print("\nrender ms, layout ms:", {name: (round(ms), round(layout)) for name, (ms, layout, _, _) in results.items()})
    for name, (ms, _, elements, size) in results.items():
        assert size >= 1_000_000, name
        assert ms < 1000, (name, ms)
        assert elements <= 5010, (name, elements)
