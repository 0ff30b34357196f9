"""The /ui playground in a real headless Chromium (Debian's chromium + chromedriver, driven by
Selenium) against the whole in-process application with API keys on: ask for the key, upload
files, ask a question, read the streamed answer and its sources, browse and filter documents,
see the settings. Screenshots land in the test's folder, and in docs/img/ with
RAGSERVE_UPDATE_SCREENSHOTS=1 (how the README's pictures are made)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.filemakers import make_pdf
from tests.live_server import live_app

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
REPO = Path(__file__).resolve().parents[2]
KEY = "sk-playground-test"
ANSWER = "Line 3's pump is serviced every week by the night shift [1]."

pytestmark = pytest.mark.skipif(
    not (CHROMIUM and CHROMEDRIVER),
    reason="needs Debian's chromium and chromium-driver: run scripts/ensure-chromium.sh (make install does)",
)


@pytest.fixture(scope="module")
def app_url(tmp_path_factory, embedding_model) -> Iterator[str]:
    from ragserve.testing.embedder import InProcessEmbedder

    with live_app(tmp_path_factory.mktemp("ui"), InProcessEmbedder(embedding_model), answer=ANSWER, api_keys=[KEY]) as (
        url,
        _,
    ):
        yield url


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


def test_upload_ask_and_browse_in_a_real_browser(browser, app_url: str, tmp_path: Path) -> None:
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

    # ask: the answer streams in, with the RAG badge and the sources and their scores
    d.find_element(By.CSS_SELECTOR, '[data-tab="chat"]').click()
    box = d.find_element(By.ID, "chat-input")
    box.send_keys("How often is the pump of line 3 serviced?")
    box.send_keys(Keys.ENTER)
    reply = wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, ".msg.assistant.done")))
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
