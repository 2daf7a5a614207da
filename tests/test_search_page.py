"""The search page of `semsearch serve` (GET /): over HTTP, and driven in a real headless Chromium
(the system's package, through Playwright) against a real uvicorn server and the real model."""
from __future__ import annotations

import os
import shutil

import pytest

pytest.importorskip("fastapi")
uvicorn = pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

from semsearch.documents import Document, upsert_documents  # noqa: E402
from semsearch.indexing import index_corpus  # noqa: E402
from semsearch.serve import Limits, Service, create_app  # noqa: E402

from conftest import SAMPLE, running  # noqa: E402

KEY = "page-test-key-0123456789abcdef"
EVIL = ("Loan officers keep notes in plain text. <script>window.pwned=1</script> "
        "<img src=x onerror=\"window.pwned=2\"> The notes say the decision took one day.")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]


pytestmark = pytest.mark.xdist_group("test_search_page")  # one worker sets the module fixtures up (pytest -n)


@pytest.fixture(scope="module")
def index(tmp_path_factory, real_encoder):
    """The sample's FAQ table and banking articles, and one document whose text holds markup."""
    root = tmp_path_factory.mktemp("page")
    corpus = root / "corpus"
    for sub in ("faq", "banking"):
        shutil.copytree(SAMPLE / sub, corpus / sub)
    folder = root / "idx"
    index_corpus(corpus, folder, real_encoder, progress=False)
    upsert_documents(folder, [Document("notes/evil.txt", EVIL, {"category": "lending", "year": 2021})], real_encoder)
    return folder


@pytest.fixture(scope="module")
def server(index, real_encoder):
    with running(create_app(Service(index, device="cpu", encoder=real_encoder))) as url:
        yield url


@pytest.fixture(scope="module")
def keyed_server(index, real_encoder):
    with running(create_app(Service(index, device="cpu", encoder=real_encoder), api_key=KEY)) as url:
        yield url


# ---- over HTTP -------------------------------------------------------------------------------
def test_the_page_is_one_self_contained_file_with_a_strict_policy(server):
    r = httpx.get(server + "/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    html = r.text
    assert html.count("<script>") == 1 and html.count("<style>") == 1
    # nothing from elsewhere: no external script, style, font or image
    assert "http://" not in html and "https://" not in html and "src=" not in html
    csp = r.headers["content-security-policy"]
    assert "default-src 'none'" in csp and "script-src 'sha256-" in csp and "connect-src 'self'" in csp
    assert "unsafe-inline" not in csp and "unsafe-eval" not in csp
    assert r.headers["x-content-type-options"] == "nosniff" and r.headers["x-frame-options"] == "DENY"
    assert "innerHTML" not in html and "insertAdjacentHTML" not in html and "document.write" not in html
    assert httpx.get(server + "/health").json()["status"] == "ok"  # unchanged


def test_explain_over_http(server):
    body = {"query": "how long does a personal loan decision take", "k": 3, "mode": "hybrid", "explain": True}
    hits = httpx.post(server + "/search", json=body, timeout=60).json()["hits"]
    assert len(hits) == 3
    for h in hits:
        e = h["explanation"]
        assert sum(t["contribution"] for t in e["dense"]["tokens"]) == pytest.approx(e["dense"]["score"], abs=1e-9)
        assert sum(t["contribution"] for t in e["lexical"]["terms"]) == pytest.approx(h["lexical_score"], rel=1e-5)
        assert e["fusion"]["fused"] == pytest.approx(h["score"])
    got = httpx.get(server + "/search", params={"q": "loan decision", "k": 2, "explain": 1, "mode": "lexical"}).json()["hits"]
    assert got and all(h["explanation"]["lexical"]["terms"] for h in got)
    plain = httpx.get(server + "/search", params={"q": "loan decision", "k": 2}).json()["hits"]
    assert all(h["explanation"] is None for h in plain)
    too_many = httpx.post(server + "/search", json={"query": "loan", "k": Limits().max_explained + 1, "explain": True})
    assert too_many.status_code == 422 and "explained" in too_many.json()["error"]["message"]
    bad = httpx.post(server + "/search", json={"query": "loan", "explain": "yes"})
    assert bad.status_code == 422


def test_with_a_key_the_page_is_open_and_the_data_is_not(keyed_server):
    assert httpx.get(keyed_server + "/").status_code == 200
    for path in ("/info", "/search?q=loan"):
        assert httpx.get(keyed_server + path).status_code == 401
    ok = httpx.get(keyed_server + "/search", params={"q": "loan"}, headers={"authorization": f"Bearer {KEY}"})
    assert ok.status_code == 200 and ok.json()["hits"]
    assert httpx.get(keyed_server + "/", headers={"host": "evil.example"}).status_code == 400  # Host rules still hold


# ---- in a browser ----------------------------------------------------------------------------
def _chromium() -> str | None:
    path = os.environ.get("SEMSEARCH_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    return path if path and os.path.exists(path) else None


@pytest.fixture(scope="module")
def browser():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("Playwright is not installed (pip install playwright; the browser is the system's Chromium)")
    exe = _chromium()
    if exe is None:
        pytest.skip("no Chromium found (apt-get install chromium, or set SEMSEARCH_CHROMIUM to its executable)")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=exe, headless=True, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser):
    ctx = browser.new_context()
    pg = ctx.new_page()
    pg.set_default_timeout(60_000)
    pg.problems = []  # console errors and uncaught exceptions of the page's own script
    pg.on("pageerror", lambda e: pg.problems.append(str(e)))
    pg.on("console", lambda m: pg.problems.append(m.text) if m.type == "error" else None)
    yield pg
    ctx.close()


# Waits go through locators, which Playwright polls without evaluating code in the page:
# page.wait_for_function polls a string predicate with eval, which the page's Content Security
# Policy forbids (no 'unsafe-eval'), so it failed whenever its first check came too early.
def wait_status(page, text: str) -> str:
    page.locator("#status", has_text=text).wait_for()
    return page.text_content("#status")


def wait_info(page, text: str) -> None:
    page.locator("#info", has_text=text).wait_for()


def hits(page) -> list[dict]:
    return page.eval_on_selector_all("article.hit", """els => els.map(a => ({
        text: a.querySelector('.text').textContent,
        loc: a.querySelector('.loc').textContent,
        meta: Object.fromEntries([...a.querySelectorAll('dl.meta dt')].map(dt => [dt.textContent, dt.nextElementSibling.textContent])),
        dense: a.querySelectorAll('.text mark.dense').length,
        lex: a.querySelectorAll('.text mark.lex').length}))""")


def test_query_modes_and_filters_in_the_browser(server, page):
    page.goto(server + "/")
    wait_info(page, "chunks")
    page.fill("#q", "how long does a personal loan decision take")
    page.press("#q", "Enter")
    assert "hybrid" in wait_status(page, "hits")
    got = hits(page)
    assert len(got) == 10
    assert got[0]["loc"].endswith("bank_faq.csv row 2") and got[0]["meta"]["category"] == "lending"
    assert got[0]["dense"] > 0 and got[0]["lex"] > 0  # strongest words shaded, query terms underlined
    marked = page.eval_on_selector_all("article.hit:first-child .text mark", "ms => ms.map(m => m.textContent.toLowerCase())")
    assert {"loan", "decisions", "personal"} <= set(marked)
    page.click("article.hit:first-child summary")
    why = page.text_content("article.hit:first-child details")
    assert "exact sum of" in why and "fusion convex" in why and "idf" in why

    page.click("label:has(#mode-lexical)")  # switching the mode searches again
    wait_status(page, "· lexical")
    lex = hits(page)
    assert lex and all(h["dense"] == 0 for h in lex) and lex[0]["lex"] > 0
    page.click("label:has(#mode-dense)")
    wait_status(page, "· dense")
    dense = hits(page)
    assert dense and all(h["lex"] == 0 for h in dense) and dense[0]["dense"] > 0

    page.fill("#where", "category=lending")  # a filter in the CLI's syntax
    page.click("#add-where")
    wait_status(page, "where category=lending")
    filtered = hits(page)
    assert filtered and all(h["meta"].get("category") == "lending" for h in filtered)
    assert page.text_content("#filters").startswith("category=lending")
    page.fill("#where", "year>=2021")
    page.press("#where", "Enter")
    wait_status(page, "where category=lending, year>=2021")
    only = hits(page)
    assert len(only) == 1 and "notes/evil.txt" in only[0]["loc"] and only[0]["meta"]["year"] == "2021"
    page.click("#filters li:first-child button")  # removing a filter searches again
    wait_status(page, "where year>=2021 ·")
    page.fill("#k", "3")
    page.click("#go")
    page.locator("article.hit").nth(3).wait_for(state="detached")  # (at most 3 hits)
    assert page.problems == []


def test_markup_in_a_document_shows_as_text_and_does_not_run(server, page):
    page.goto(server + "/")
    page.fill("#q", "loan officers notes script pwned")
    page.click("label:has(#mode-lexical)")
    page.click("#go")
    wait_status(page, "hits")
    evil = [h for h in hits(page) if "<script>" in h["text"]]
    assert evil, "the document with markup is not among the hits"
    assert "<script>window.pwned=1</script>" in evil[0]["text"] and 'onerror="window.pwned=2"' in evil[0]["text"]
    assert page.evaluate("typeof window.pwned") == "undefined"
    assert page.eval_on_selector_all("#results script, #results img", "els => els.length") == 0
    page.click("label:has(#mode-hybrid)")  # the same with the explanation's highlighting cutting the text
    wait_status(page, "· hybrid")
    assert any("<script>window.pwned=1</script>" in h["text"] for h in hits(page))
    assert page.evaluate("typeof window.pwned") == "undefined"
    assert page.problems == []


def test_a_key_pasted_into_the_page(keyed_server, page):
    page.goto(keyed_server + "/")
    wait_info(page, "API key")
    page.fill("#q", "personal loan decision")
    page.click("#go")
    wait_status(page, "an API key is required")
    assert hits(page) == []
    page.fill("#key", "not-the-key-0123456789")
    page.click("#save-key")
    wait_status(page, "wrong")
    page.fill("#key", KEY)
    page.click("#save-key")  # kept in this tab's sessionStorage, sent as a bearer token
    wait_status(page, "hits")
    assert hits(page) and page.evaluate("sessionStorage.getItem('semsearch.key')") == KEY
    assert page.input_value("#key") == ""  # not left on screen
    wait_info(page, "chunks")
    page.click("#forget-key")
    assert page.evaluate("sessionStorage.getItem('semsearch.key')") is None
    # the 401s above are the browser's own console lines about failed requests, nothing else
    assert all("401" in p for p in page.problems), page.problems
