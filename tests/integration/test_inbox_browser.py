"""The web inbox (services/gateway/inbox.py) in a real browser: Debian's headless Chromium,
driven by selenium through chromedriver (tests/install_chromium.sh; `make test` installs
them), against a real gateway beside the four real services, on both stores (what the page alone
decides, its keys, contrast and forms, on SQLite alone).

Each test saves screenshots under artifacts/inbox/ (ignored by git) as it goes, so a
failure can be looked at; README.md shows two of them, copied into docs/ from a run."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import time
from pathlib import Path

import httpx
import pytest

from shared.ledger.tables import ApprovalRequest, AuditEntry, Decision
from shared.messages import mint
from tests.gateway_client import PASSWORD, GatewayClient
from tests.harness import eventually, rows
from tests.integration.test_gateway import add_people, gateway_alone, pending_card, start, url

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts" / "inbox"
WAIT = 30.0

pytestmark = pytest.mark.skipif(
    not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)),
    reason="Chromium and chromedriver are missing: bash tests/install_chromium.sh (make test runs it)",
)


# --- the browser --------------------------------------------------------------------------------


class Browser:
    """One person's browser window: headless Chromium with a profile of its own (its own cookies)."""

    def __init__(self, base: str, name: str) -> None:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        options = webdriver.ChromeOptions()
        options.binary_location = CHROMIUM
        for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                         "--window-size=1200,1000", "--force-device-scale-factor=1", "--lang=en-GB"):
            options.add_argument(argument)
        self.driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
        self.driver.set_page_load_timeout(WAIT)
        self.base, self.name = base, name

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.driver.quit()

    def open(self, path: str) -> None:
        self.driver.get(self.base + path)

    def find(self, css: str):
        from selenium.webdriver.common.by import By

        return self.driver.find_element(By.CSS_SELECTOR, css)

    def all(self, css: str) -> list:
        from selenium.webdriver.common.by import By

        return self.driver.find_elements(By.CSS_SELECTOR, css)

    def until(self, check, timeout: float = WAIT, what: str = "the page to change"):
        """Polls `check(self)` until it is truthy (errors count as not yet)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                found = check(self)
            except Exception:  # an element swapped out under us: look again
                found = None
            if found:
                return found
            if time.monotonic() > deadline:
                self.shot(f"timeout-{self.name}")
                raise AssertionError(f"{self.name}: timed out waiting for {what} at {self.driver.current_url}")
            time.sleep(0.1)

    def read(self, css: str) -> str:
        """The element's text, looked up again if the page's live update swapped it out
        between finding it and reading it (a stale element)."""
        read: list[str] = []
        self.until(lambda b: read.append(b.find(css).text) or True, what=f"{css} to read")
        return read[-1]

    def click(self, css: str) -> None:
        """Clicks the element, looked up again if the page's live update swapped it out."""
        self.until(lambda b: b.find(css).click() or True, what=f"{css} to click")

    def text(self) -> str:
        return self.read("body")

    def login(self, name: str, password: str = PASSWORD) -> None:
        self.open("/inbox/login")
        self.find("#name").send_keys(name)
        self.find("#password").send_keys(password)
        self.click("#login")
        self.until(lambda b: b.driver.current_url.endswith("/inbox") and b.find("h1").text == "Inbox",
                   what="the inbox after logging in")

    def live(self) -> None:
        """Until the page's event stream is open (its script marks the body)."""
        self.until(lambda b: b.find("body").get_attribute("data-live") == "on", what="the event stream")

    def shot(self, name: str) -> Path:
        """The whole page (the window grown to its height for the picture), saved as a test artifact."""
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        path = ARTIFACTS / f"{name}.png"
        size = self.driver.get_window_size()
        height = self.driver.execute_script("return document.documentElement.scrollHeight")
        self.driver.set_window_size(size["width"], max(size["height"], min(int(height) + 140, 4000)))
        try:
            self.driver.save_screenshot(str(path))
        finally:
            self.driver.set_window_size(size["width"], size["height"])
        return path


@pytest.fixture
def browsers(gateway):
    opened: list[Browser] = []

    def open_browser(name: str) -> Browser:
        browser = Browser(url(gateway), name)
        opened.append(browser)
        return browser

    yield open_browser
    for browser in opened:
        browser.close()


@pytest.fixture
def gateway(deployment, sink):
    deployment.extra_env["SINK_URL"] = sink.url
    add_people(deployment)
    deployment.start()
    deployment.start("gateway")
    return deployment


def card_in_inbox(request_id: str):
    return lambda b: b.all(f"#cards [data-request='{request_id}']")


async def ran(sink, path: str, times: int) -> None:
    await eventually(lambda: _now(sink.counts[path] == times), WAIT)
    await asyncio.sleep(0.5)
    assert sink.counts[path] == times


async def _now(value):
    return value


# --- the tests ----------------------------------------------------------------------------------


async def test_a_person_logs_in_approves_from_the_inbox_and_the_tool_runs_once(gateway, sink, browsers, store):
    alice = browsers("alice")
    alice.login("alice")
    alice.live()
    async with GatewayClient(url(gateway)) as sam:
        await sam.login("sam")
        session_id = await start(sam, "reviewed")
        card = await pending_card(sam, session_id)
    # The card arrives in the open inbox without a reload.
    alice.until(card_in_inbox(card["id"]), what="the new card in the inbox")
    summary = alice.find(f"#card-{card['id']}").text
    for shown in ("post_reviewed", "outward", "alice, bob, carol", "0 of 1", '"message": "reviewed"'):
        assert shown in summary, (shown, summary)
    alice.shot(f"inbox-{store}")
    alice.click(f"#open-{card['id']}")
    alice.until(lambda b: b.all("#approve"), what="the card page")
    assert alice.read("#digest") == card["args_digest"]
    assert alice.find("#approve-form input[name=args_digest]").get_attribute("value") == card["args_digest"]
    alice.find("#message").send_keys("Looks right; post it.")
    alice.shot(f"card-{store}")
    alice.click("#approve")
    alice.until(lambda b: "You approved" in b.find("#notice").text, what="the approval's notice")
    assert not alice.all(f"#cards [data-request='{card['id']}']")
    await ran(sink, "/reviewed", 1)
    [decision] = await rows(gateway, Decision, request_id=card["id"])
    assert (decision.responder, decision.channel, decision.decision) == ("alice", "gateway", "approve")
    assert decision.message == "Looks right; post it."
    # Sent again (the browser's back button and resubmit): the same form decides once.
    alice.driver.back()
    alice.until(lambda b: "/inbox/requests/" in b.driver.current_url, what="the card page again")
    await ran(sink, "/reviewed", 1)


async def test_when_one_person_approves_the_card_leaves_the_other_persons_open_inbox_live(
        gateway, sink, browsers, store):
    alice, bob = browsers("alice"), browsers("bob")
    alice.login("alice")
    bob.login("bob")
    async with GatewayClient(url(gateway)) as sam:
        await sam.login("sam")
        card = await pending_card(sam, await start(sam, "reviewed"))
    for browser in (alice, bob):
        browser.open("/inbox")
        browser.live()
        browser.until(card_in_inbox(card["id"]), what="the card")
    # Proof that alice's page is never reloaded: a mark on its window survives.
    alice.driver.execute_script("window.__notReloaded = true")
    bob.click(f"#open-{card['id']}")
    bob.click("#approve")
    bob.until(lambda b: b.all("#notice"), what="bob's notice")
    alice.until(lambda b: not card_in_inbox(card["id"])(b), what="the card to leave alice's inbox")
    assert alice.driver.execute_script("return window.__notReloaded === true"), "alice's inbox was reloaded"
    assert "Nothing waits for your approval" in alice.read("#cards")
    alice.shot(f"two-browsers-alice-after-{store}")
    await ran(sink, "/reviewed", 1)
    [decision] = await rows(gateway, Decision, request_id=card["id"])
    assert decision.responder == "bob"


async def test_a_denial_needs_a_reason_and_the_model_is_told_it(gateway, sink, browsers, store):
    alice = browsers("alice")
    alice.login("alice")
    async with GatewayClient(url(gateway)) as client:
        await client.login("alice")
        card = await pending_card(client, await start(client, "reviewed"))
    alice.open(f"/inbox/requests/{card['id']}")
    alice.until(lambda b: b.all("#deny"))
    # The browser will not send a denial without a reason ...
    assert alice.find("#reason").get_attribute("required") is not None
    alice.click("#deny")
    assert "/inbox/requests/" in alice.driver.current_url and alice.all("#deny")
    # ... and neither will the gateway, should a page send one anyway.
    alice.driver.execute_script("document.getElementById('reason').removeAttribute('required')")
    alice.click("#deny")
    alice.until(lambda b: b.find("#problem-title").text == "Say why you deny it", what="the reason-required page")
    assert await rows(gateway, Decision, request_id=card["id"]) == []
    alice.open(f"/inbox/requests/{card['id']}")
    alice.find("#reason").send_keys("Not on a Friday.")
    alice.click("#deny")
    alice.until(lambda b: "You denied" in b.find("#notice").text)
    [decision] = await rows(gateway, Decision, request_id=card["id"])
    assert (decision.decision, decision.reason) == ("deny", "Not on a Friday.")
    # The session page: the story, and the transcript where the model reads the reason.
    alice.open(f"/inbox/sessions/{card['session_id']}")
    alice.until(lambda b: "Reason: Not on a Friday." in b.find("#transcript").text, what="the model's view")
    story = alice.read("#story")
    assert f"{card['id']} was denied by alice: Not on a Friday." in story, story
    assert "alice started turn" in story and "closed as denied" in story, story
    alice.shot(f"session-denied-{store}")
    await ran(sink, "/reviewed", 0)


async def test_an_expired_card_cannot_be_approved_and_says_so(deployment, sink, store):
    deployment.extra_env.update(SINK_URL=sink.url, SIGNOFF_APPROVAL_TIMEOUT_SECONDS="8")
    add_people(deployment)
    deployment.start()
    deployment.start("gateway")
    alice = Browser(url(deployment), "alice")
    try:
        alice.login("alice")
        async with GatewayClient(url(deployment)) as client:
            await client.login("alice")
            card = await pending_card(client, await start(client, "reviewed"))
        alice.open(f"/inbox/requests/{card['id']}")
        alice.live()
        assert alice.find("#approve").is_enabled()
        # It expires while the page is open: the page says so, live, and its buttons go.
        alice.until(lambda b: b.all("#closed") and "expired" in b.find("#closed").text, timeout=WAIT,
                    what="the card to say it expired")
        assert not alice.all("#approve")
        alice.shot(f"expired-live-{store}")
        # A page opened before it expired still sends its form (a browser without the script):
        # the ledger refuses it and the page says why.
        alice.open(f"/inbox/requests/{card['id']}")
        assert "expired" in alice.read("#status") and not alice.all("#approve")
        stale = await stale_approval(deployment, alice, card)
        assert stale.status_code == 409, stale.text
        assert "This card expired" in stale.text and "<code>expired</code>" in stale.text
    finally:
        alice.close()
    [request] = await rows(deployment, ApprovalRequest, id=card["id"])
    assert request.status == "expired"
    assert await rows(deployment, Decision, request_id=card["id"]) == []
    await ran(sink, "/reviewed", 0)


async def stale_approval(deployment, browser: Browser, card: dict) -> httpx.Response:
    """The approval form the card page sent before the card expired, sent now with the
    browser's own cookie and CSRF token (what a page without its script would send)."""
    cookie = browser.driver.get_cookie("signoff_session")["value"]
    csrf = browser.find("input[name=csrf_token]").get_attribute("value")
    async with httpx.AsyncClient(base_url=url(deployment), timeout=30) as http:
        return await http.post(
            f"/inbox/requests/{card['id']}/decision",
            data={"csrf_token": csrf, "idempotency_key": "stale-page", "decision": "approve",
                  "args_digest": card["args_digest"]},
            headers={"Cookie": f"signoff_session={cookie}", "Origin": url(deployment)},
        )


async def test_a_person_who_may_not_approve_sees_the_ledgers_reason_and_nothing_changes(
        gateway, sink, browsers, store):
    sam = browsers("sam")
    sam.login("sam")
    async with GatewayClient(url(gateway)) as client:
        await client.login("sam")
        card = await pending_card(client, await start(client, "separated"))
    sam.open("/inbox")
    sam.until(card_in_inbox(card["id"]))
    # His own session's card waits on someone else, and the inbox says why.
    assert sam.all(f"section[aria-labelledby=others-heading] [data-request='{card['id']}']")
    assert not sam.all(f"section[aria-labelledby=mine-heading] [data-request='{card['id']}']")
    assert "you started this session" in sam.find(f"#card-{card['id']}").text
    sam.click(f"#open-{card['id']}")
    sam.until(lambda b: b.all("#hint"))
    sam.click("#approve")
    sam.until(lambda b: b.all("#refused-title"), what="the refusal page")
    assert sam.read("#refused-title") == "You may not approve this"
    reason = sam.read("#refused-reason")
    assert "starter_may_not_approve" in reason and "sam" in reason, reason
    sam.shot(f"may-not-approve-{store}")
    [rejected] = await rows(gateway, AuditEntry, session_id=card["session_id"], kind="response.rejected")
    assert (rejected.actor, rejected.detail["reason_code"]) == ("sam", "starter_may_not_approve")
    [request] = await rows(gateway, ApprovalRequest, id=card["id"])
    assert request.status == "pending" and await rows(gateway, Decision, request_id=card["id"]) == []
    await ran(sink, "/separated", 0)


async def test_the_starter_reads_the_sessions_story_and_cancels_its_open_turn_from_its_page(
        gateway, sink, browsers, store):
    alice = browsers("alice")
    alice.login("alice")
    alice.find("#start-text").send_keys("Post the reviewed message, please.")
    alice.click("#start")
    alice.until(lambda b: "/inbox/sessions/" in b.driver.current_url, what="the new session's page")
    session_id = alice.driver.current_url.rsplit("/", 1)[1]
    alice.live()
    # The tests' default reply calls post_to_sink with an API token among its arguments; the
    # turn waits for a person, and the page shows it live.
    alice.until(lambda b: "waiting on 1 card" in b.find("#turn-status").text, what="the turn to wait on a card")
    alice.click("#session-live ul a")
    alice.until(lambda b: b.all("#arguments"))
    assert '"api_token": "***redacted***"' in alice.read("#arguments")
    assert "sk-secret-123" not in alice.driver.page_source
    alice.driver.back()
    alice.live()
    story = alice.read("#story")
    assert "alice started turn" in story and "needs a person's approval" in story, story
    alice.find("#cancel-reason").send_keys("Changed my mind.")
    alice.click("#cancel")
    alice.until(lambda b: "cancelled by alice: Changed my mind." in b.find("#turn-status").text,
                what="the turn to say it was cancelled")
    alice.until(lambda b: "closed as cancelled" in b.find("#story").text, what="the story to tell the closure")
    alice.until(lambda b: b.find("#session-status").text.startswith("cancelled"), what="the session's status")
    assert not alice.all("#cancel")
    alice.shot(f"session-cancelled-{store}")
    [request] = await rows(gateway, ApprovalRequest, session_id=session_id)
    assert request.status == "cancelled"
    assert sum(sink.counts.values()) == 0


def press(browser: Browser, *keys: str) -> None:
    from selenium.webdriver.common.action_chains import ActionChains

    ActionChains(browser.driver).send_keys(*keys).perform()


def tab_to(browser: Browser, element_id: str, most: int = 40) -> int:
    """Presses Tab until the element has focus; how many presses it took."""
    from selenium.webdriver.common.keys import Keys

    for presses in range(1, most + 1):
        press(browser, Keys.TAB)
        if browser.driver.execute_script("return document.activeElement.id") == element_id:
            return presses
    browser.shot(f"keyboard-lost-{browser.name}")
    raise AssertionError(f"Tab never reached #{element_id}")


@gateway_alone
async def test_the_whole_approval_works_from_the_keyboard_alone(gateway, sink, browsers, store):
    from selenium.webdriver.common.keys import Keys

    async with GatewayClient(url(gateway)) as sam:
        await sam.login("sam")
        card = await pending_card(sam, await start(sam, "reviewed"))
    alice = browsers("alice")
    alice.open("/inbox/login")
    # The name field has focus; type, Tab, type, Enter.
    assert alice.driver.execute_script("return document.activeElement.id") == "name"
    press(alice, "alice", Keys.TAB, PASSWORD, Keys.ENTER)
    alice.until(lambda b: b.find("h1").text == "Inbox")
    tab_to(alice, f"open-{card['id']}")
    press(alice, Keys.ENTER)
    alice.until(lambda b: b.all("#approve"))
    tab_to(alice, "message")
    press(alice, "From the keyboard.")
    tab_to(alice, "approve")
    alice.shot(f"keyboard-focus-on-approve-{store}")
    # The focused button is visibly marked (an outline), not only focused.
    outline = alice.driver.execute_script(
        "const s = getComputedStyle(document.activeElement); return [s.outlineStyle, s.outlineWidth]")
    assert outline[0] != "none" and outline[1] != "0px", outline
    press(alice, Keys.ENTER)
    alice.until(lambda b: "You approved" in b.find("#notice").text)
    await ran(sink, "/reviewed", 1)
    [decision] = await rows(gateway, Decision, request_id=card["id"])
    assert (decision.responder, decision.message) == ("alice", "From the keyboard.")


# The contrast of every piece of text on the page against what it is drawn on, as the browser
# computes them (WCAG 2.1 relative luminance); and every control's accessible label.
CONTRAST = """
const parse = (c) => { const m = c.match(/rgba?\\(([^)]+)\\)/); if (!m) return null;
  const p = m[1].split(',').map(Number); return {r: p[0], g: p[1], b: p[2], a: p.length > 3 ? p[3] : 1}; };
const channel = (v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); };
const lum = (c) => 0.2126 * channel(c.r) + 0.7152 * channel(c.g) + 0.0722 * channel(c.b);
const background = (el) => {
  for (let e = el; e; e = e.parentElement) {
    const c = parse(getComputedStyle(e).backgroundColor); if (c && c.a > 0) return c;
  }
  return {r: 255, g: 255, b: 255, a: 1};
};
const found = [];
for (const el of document.querySelectorAll('body *')) {
  const own = Array.from(el.childNodes).some((n) => n.nodeType === 3 && n.textContent.trim());
  const style = getComputedStyle(el);
  if (!own || style.visibility === 'hidden' || style.display === 'none' || el.closest('.visually-hidden')) continue;
  if (!el.getClientRects().length) continue;
  const fg = parse(style.color), bg = background(el);
  const [hi, lo] = [lum(fg), lum(bg)].sort((a, b) => b - a);
  const size = parseFloat(style.fontSize), bold = parseInt(style.fontWeight) >= 700;
  const large = size >= 24 || (bold && size >= 18.66);
  found.push({tag: el.tagName, id: el.id, text: el.textContent.trim().slice(0, 40),
              ratio: (hi + 0.05) / (lo + 0.05), needed: large ? 3 : 4.5});
}
return found;
"""
UNLABELLED = """
return Array.from(document.querySelectorAll('input:not([type=hidden]), textarea, select, button'))
  .filter((el) => !((el.labels && el.labels.length) || el.getAttribute('aria-label')
                    || (el.tagName === 'BUTTON' && el.textContent.trim())))
  .map((el) => el.outerHTML.slice(0, 80));
"""


@gateway_alone
async def test_every_text_on_the_inbox_passes_wcag_aa_contrast_and_every_control_has_a_label(
        gateway, sink, browsers, store):
    async with GatewayClient(url(gateway)) as sam:
        await sam.login("sam")
        card = await pending_card(sam, await start(sam, "reviewed"))
        await pending_card(sam, await start(sam, "separated"))
    alice = browsers("alice")
    alice.login("alice")
    alice.until(card_in_inbox(card["id"]))
    pages = {"inbox": "/inbox", "card": f"/inbox/requests/{card['id']}",
             "session": f"/inbox/sessions/{card['session_id']}", "login": "/inbox/login"}
    checked = 0
    for name, path in pages.items():
        if name == "session":
            alice.login("sam")  # the session's starter sees its page
        if name == "login":
            alice.click("form[action='/inbox/logout'] button")
            alice.until(lambda b: b.all("#login"))
        alice.open(path)
        alice.until(lambda b: b.find("h1"))
        texts = alice.driver.execute_script(CONTRAST)
        failing = [t for t in texts if t["ratio"] < t["needed"]]
        assert failing == [], f"{name}: text below WCAG AA contrast: {failing}"
        assert alice.driver.execute_script(UNLABELLED) == [], f"{name}: a control without a label"
        checked += len(texts)
    assert checked > 40  # the checks saw the pages' text, not an empty page
    # A check that can fail: grey on white text (2.3:1) is caught.
    alice.driver.execute_script("document.querySelector('h1').style.color = '#aaaaaa'")
    assert any(t["tag"] == "H1" and t["ratio"] < t["needed"] for t in alice.driver.execute_script(CONTRAST))


@gateway_alone
async def test_a_forged_form_without_the_pages_digest_or_csrf_token_or_from_another_origin_changes_nothing(
        gateway, sink):
    async with GatewayClient(url(gateway)) as alice:
        await alice.login("alice")
        card = await pending_card(alice, await start(alice, "reviewed"))
        other = await pending_card(alice, await start(alice, "reviewed"))
        cookie = {"Cookie": f"signoff_session={alice.cookie}"}
        path = f"/inbox/requests/{card['id']}/decision"
        form = {"csrf_token": alice.csrf, "idempotency_key": "forged", "decision": "approve",
                "args_digest": card["args_digest"]}

        async def send(fields: dict, headers: dict | None = None) -> httpx.Response:
            return await alice.http.post(path, data=fields, headers={**cookie, **(headers or {})})

        # No digest: the page must name the one it showed (the API alone would take the ledger's).
        answer = await send({**form, "args_digest": ""})
        assert answer.status_code == 422 and "names no arguments" in answer.text
        # Another request's digest: the ledger refuses to approve other arguments.
        answer = await send({**form, "args_digest": other["args_digest"], "idempotency_key": "forged-2"})
        assert answer.status_code == 409 and "digest_mismatch" in answer.text, answer.text
        # No CSRF token, a wrong one, and a page of another origin.
        assert (await send({**form, "csrf_token": ""})).status_code == 403
        assert (await send({**form, "csrf_token": "forged"})).status_code == 403
        answer = await send(form, {"Origin": "https://evil.test"})
        assert answer.status_code == 403 and "another origin" in answer.text.lower()
        # Not logged in: sent to log in, nothing decided.
        assert (await alice.http.post(path, data=form)).status_code == 401
        # No page may be framed by another site (a click on "Approve" it did not mean), nor load
        # anything from elsewhere.
        page = await alice.get(f"/inbox/requests/{card['id']}")
        assert page.status_code == 200 and page.headers["x-frame-options"] == "DENY"
        policy = page.headers["content-security-policy"]
        assert "frame-ancestors 'none'" in policy and "script-src 'self'" in policy, policy
        # A program's token is not a person: the pages are not for it.
        assert (await alice.http.get("/inbox", headers={"Authorization": "Bearer signoff_x"})).status_code == 403
    for request in (card, other):
        [found] = await rows(gateway, ApprovalRequest, id=request["id"])
        assert found.status == "pending" and await rows(gateway, Decision, request_id=request["id"]) == []
    await ran(sink, "/reviewed", 0)


async def test_edit_then_approve_the_edited_arguments_run_and_the_transcript_and_audit_log_show_the_edit(
        deployment, sink, store):
    """A refund of 5,000 needs two approvers. bob approves it as proposed; alice edits the
    amount to 4,000 and approves: the count restarts (bob approved other arguments), bob's
    open card page shows the edited version live, bob approves that, and exactly the
    edited arguments run, once; the session page's transcript and story show the edit."""
    from tests.integration.test_gateway_approval_rules import tools_with_a_refund_rule

    deployment.extra_env["SINK_URL"] = sink.url
    deployment.tools_file = tools_with_a_refund_rule(deployment)
    add_people(deployment)
    deployment.start()
    deployment.start("gateway")
    alice, bob = Browser(url(deployment), "alice"), Browser(url(deployment), "bob")
    try:
        async with GatewayClient(url(deployment)) as client, GatewayClient(url(deployment)) as bob_api:
            await client.login("alice")
            await bob_api.login("bob")
            card = await pending_card(client, await start(client, "refund-large"))
            assert card["approvals_required"] == 2
            first = (await bob_api.decide(card["id"], args_digest=card["args_digest"])).json()
            assert (first["decided"], first["approvals"]) == (False, 1), first
        bob.login("bob")
        bob.open(f"/inbox/requests/{card['id']}")
        bob.live()
        assert bob.read("#approvals") == "1 of 2" and bob.read("#digest") == card["args_digest"]
        assert "you approved it" in bob.read("#hint")
        alice.login("alice")
        alice.open(f"/inbox/requests/{card['id']}")
        alice.until(lambda b: b.all("#edit-form"), what="the edit form")
        amount = alice.find("#edit-form input[name='arg.amount']")
        assert amount.get_attribute("value") == "5000"
        amount.clear()
        amount.send_keys("4000")
        alice.shot(f"edit-{store}")
        alice.click("#edit-approve")
        alice.until(lambda b: "counted" in b.find("#notice").text, what="alice's approval counted")
        # bob's open page shows the edited version without a reload: its arguments, the edit, a new digest.
        bob.until(lambda b: b.find("#digest").text != card["args_digest"], what="the edited card on bob's page")
        bob.until(lambda b: b.find("#approvals").text == "1 of 2", what="the restarted count")
        assert '"amount": 4000' in bob.read("#arguments")
        # bob's approval was of 5,000: the page no longer says he approved this version.
        assert not bob.all("#hint")
        assert "alice changed them: amount: 5000 → 4000" in bob.read("#edited")
        assert bob.find("#approve-form input[name=args_digest]").get_attribute("value") == bob.read("#digest")
        bob.shot(f"edited-card-live-{store}")
        await ran(sink, "/refunds", 0)
        bob.click("#approve")
        bob.until(lambda b: "You approved" in b.find("#notice").text, what="bob's approval deciding")
        await ran(sink, "/refunds", 1)
        assert json.loads(sink.requests[-1]["body"]) == {"amount": 4000, "customer": "c-2"}
        # The session page: the model was told what changed and the call as approved; the story shows the edit.
        alice.open(f"/inbox/sessions/{card['session_id']}")
        alice.until(lambda b: "Refunded a lot." in b.find("#transcript").text, what="the turn's end")
        transcript = alice.read("#transcript")
        assert "alice changed the arguments before approving: amount: 5000 → 4000" in transcript, transcript
        assert 'The call was approved with these arguments: {"amount": 4000, "customer": "c-2"}' in transcript
        story = alice.read("#story")
        assert f"alice edited the arguments of {card['id']} (refund) before approving: amount: 5000 → 4000" in story
        assert "1 earlier approval(s) no longer count" in story and "ran: output" in story, story
        alice.shot(f"session-edited-{store}")
    finally:
        alice.close()
        bob.close()
    [edited] = await rows(deployment, AuditEntry, session_id=card["session_id"], kind="arguments.edited")
    assert (edited.actor, edited.detail["original_digest"], edited.detail["approvals_withdrawn"]) == (
        "alice", card["args_digest"], 1)
    [request] = await rows(deployment, ApprovalRequest, id=card["id"])
    assert edited.detail["edited_digest"] == request.args_digest != card["args_digest"]
    accepted = await rows(deployment, AuditEntry, session_id=card["session_id"], kind="response.accepted")
    assert sorted(e.actor for e in accepted) == ["alice", "bob", "bob"]
    [decision] = await rows(deployment, Decision, request_id=card["id"])
    assert decision.responder == "bob"


def keep_screenshots_for_the_readme(store: str) -> None:  # pragma: no cover - run by hand
    """`python -c 'from tests.integration.test_inbox_browser import *; keep_screenshots_for_the_readme("sqlite")'`
    after a run: copies the inbox and a card into docs/."""
    docs = Path(__file__).resolve().parents[2] / "docs"
    shutil.copy(ARTIFACTS / f"inbox-{store}.png", docs / "inbox.png")
    shutil.copy(ARTIFACTS / f"card-{store}.png", docs / "inbox-card.png")


async def test_approve_and_remember_the_next_matching_call_runs_without_a_card_and_after_revocation_the_next_one_asks_again(
        deployment, sink, store):
    from shared.ledger.tables import Grant, ToolCall
    from tests.integration.test_gateway_grants import idle, tools_with_a_rememberable_refund, turn

    deployment.extra_env["SINK_URL"] = sink.url
    deployment.tools_file = tools_with_a_rememberable_refund(deployment)
    add_people(deployment)
    deployment.start()
    deployment.start("gateway")
    alice = Browser(url(deployment), "alice")
    try:
        alice.login("alice")
        async with GatewayClient(url(deployment)) as client:
            await client.login("alice")
            session_id = f"recall-{mint('ses')}"
            await turn(client, session_id)
            card = await pending_card(client, session_id)
            alice.open(f"/inbox/requests/{card['id']}")
            alice.until(lambda b: b.all("#approve-remember"), what="the approve-and-remember form")
            # With this target (customer c-1) and for the rest of the session: the form's defaults.
            assert alice.find("#remember-this").is_selected() and alice.find("#remember-session").is_selected()
            assert "customer c-1" in alice.read("label[for=remember-this]")
            alice.shot(f"card-remember-{store}")
            alice.click("#approve-remember")
            alice.until(lambda b: "You approved" in b.find("#notice").text, what="the approval's notice")
            await ran(sink, "/refunds", 1)
            await idle(client, session_id)

            # The next refund to c-1 runs with no card.
            await turn(client, session_id)
            await ran(sink, "/refunds", 2)
            await idle(client, session_id)
            assert len(await rows(deployment, ApprovalRequest, session_id=session_id)) == 1
            [grant] = await rows(deployment, Grant, session_id=session_id)
            assert [c.grant_id for c in await rows(deployment, ToolCall, session_id=session_id)].count(grant.id) == 1

            # The session's page lists the grant; revoking it there is recorded.
            alice.open(f"/inbox/sessions/{session_id}")
            alice.until(lambda b: b.find(f"#grant-{grant.id}").get_attribute("data-live") == "yes",
                        what="the live grant on the session's page")
            assert "customer c-1" in alice.find(f"#grant-{grant.id}").text
            story = alice.read("#story")
            assert f"grant {grant.id}" in story and "runs without a card" in story, story
            alice.shot(f"session-grant-{store}")
            alice.click(f"#revoke-{grant.id}")
            alice.until(lambda b: "revoked by alice" in b.find(f"#grant-{grant.id}").text,
                        what="the grant to show revoked")
            assert not alice.all(f"#revoke-{grant.id}")
            alice.shot(f"session-grant-revoked-{store}")
            [row] = await rows(deployment, Grant, id=grant.id)
            assert (row.revoked_by, row.revoked_at is not None) == ("alice", True)

            # After the revocation the same call asks again, and the card reaches the inbox.
            await turn(client, session_id)
            again = await pending_card(client, session_id)
            assert again["target"] == "customer c-1" and again["id"] != card["id"]
            alice.open("/inbox")
            alice.until(card_in_inbox(again["id"]), what="the new card in the inbox")
            await ran(sink, "/refunds", 2)
    finally:
        alice.close()


def test_a_newcomer_opens_the_inbox_make_run_prints_asks_the_agent_and_approves_its_card_in_a_browser(
        up_sqlite_deployment):
    """What `make run` runs (`signoff demo`, with deploy/'s tools and script): the inbox's URL
    and login it prints work; asking the agent from the inbox makes a card, approving it in
    the browser runs the tool, and the session's page shows it ran and the model's answer."""
    import re
    import subprocess
    import sys

    from shared.settings import PROJECT_ROOT
    from tests.integration.test_supervisor import Output, wait_until

    ours = ("SIGNOFF_TOOLS_FILE", "SIGNOFF_SCRIPT_FILE")  # deploy/'s, as `make run` has them
    env = {k: v for k, v in up_sqlite_deployment.env().items() if k not in ours}
    demo = subprocess.Popen([sys.executable, "-m", "services.operations.cli", "demo"], env=env, cwd=PROJECT_ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    output = Output(demo)
    browser = None
    try:
        wait_until(lambda: "Ctrl-C stops the services." in output.text or demo.poll() is not None, 180, "the demo")
        assert demo.poll() is None, output.text
        inbox, name, password = re.search(r"The inbox: (http://\S+)/inbox\s+\(log in as (\S+) / (\S+);",
                                          output.text).groups()
        browser = Browser(inbox, "newcomer")
        browser.login(name, password)
        browser.find("#start-text").send_keys("Publish the notes for 1.3")
        browser.click("#start")
        browser.until(lambda b: "waiting on 1 card" in b.find("#turn-status").text, what="the demo's card")
        session_page = browser.driver.current_url
        browser.click("#session-live ul a")
        browser.until(lambda b: b.all("#approve"))
        assert "publish_post" in browser.read("#card-state") and "outward" in browser.read("#card-state")
        browser.shot("make-run-card")
        browser.click("#approve")
        browser.until(lambda b: "You approved" in b.find("#notice").text)
        # The session's page: the tool ran once, and the model's answer.
        browser.driver.get(session_page)
        browser.until(lambda b: "Done: the release notes are published." in b.find("#transcript").text,
                      what="the model's answer")
        story = browser.read("#story")
        assert story.count("ran: output") == 1 and f"was approved by {name}" in story, story
        browser.shot("make-run-session")
    finally:
        if browser is not None:
            browser.close()
        demo.send_signal(signal.SIGINT)
        assert output.exit_code() == 0, output.text
