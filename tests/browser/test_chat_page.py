"""The chat page of `memchat dev` in a real browser: headless Chromium
(Debian's package) driven by selenium through Debian's chromedriver.

`memchat dev` runs as a subprocess against the test database; its model is
the fake OpenAI server, pacing its answers 0.15 s a word, so the page's
assistant bubble can be seen growing. A MutationObserver installed in the
page records every length the bubble's text takes. Each stored answer has
thumbs (feedback), and the stats panel shows the agent's counts.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from memchat import bootstrap
from tests.conftest import make_settings
from tests.utils.browser import WAIT, chromium, wait
from tests.utils.dev_server import DevServer, dev_server
from tests.utils.fake_openai import FakeOpenAI, tool_call

RATED_ANSWER = "Oolong can be steeped several times, a little longer each time."
OTHER_ANSWER = "Yes: a quick rinse wakes the leaves."

FIRST_ANSWER = "Green tea is best brewed below boiling, for two or three minutes at most."
SECOND_ANSWER = "Noted: you like green tea, and I will keep that in mind from now on."

# Records, for every change under #log, (assistant bubbles, the last one's
# text length, whether it is still streaming).
OBSERVE = """
window.lengths = [];
const log = document.getElementById("log");
new MutationObserver(() => {
  const bubbles = log.querySelectorAll(".msg.assistant");
  const last = bubbles[bubbles.length - 1];
  if (last) window.lengths.push([bubbles.length, last.querySelector(".text").textContent.length,
                                 last.classList.contains("streaming")]);
}).observe(log, { childList: true, subtree: true, characterData: true });
"""


# The model paces its answers: seconds between the pieces (conftest `dev_model`).
MODEL_CHUNK_DELAY = 0.15


@pytest.fixture
def downloads(tmp_path: Path) -> Path:
    path = tmp_path / "downloads"
    path.mkdir()
    return path


@pytest.fixture
def browser(downloads: Path) -> Iterator[WebDriver]:
    with chromium(downloads) as driver:
        yield driver


# ---------------------------------------------------------------- helpers


def open_page(driver: WebDriver, url: str) -> None:
    """Load the page (restoring any stored conversation) and start recording."""
    driver.get(url)
    wait(
        driver,
        "the page to be ready",
        lambda d: d.execute_script("return document.body.dataset.ready"),
    )
    driver.execute_script(OBSERVE)


def texts(driver: WebDriver, selector: str) -> list[str]:
    found = driver.execute_script(
        "return [...document.querySelectorAll(arguments[0])].map((e) => e.textContent)", selector
    )
    return [str(text) for text in found]


def send(driver: WebDriver, message: str) -> None:
    """Type and send a message; returns once the page can send again."""
    driver.find_element(By.ID, "text").send_keys(message)
    driver.find_element(By.ID, "send").click()
    wait(
        driver,
        "the answer to end",
        lambda d: d.execute_script(
            "return !document.getElementById('send').disabled"
            " && !document.querySelector('.msg.assistant.streaming')"
        ),
    )


def exchange(driver: WebDriver, message: str, answer: str) -> None:
    """Send a message; check its answer grew in the bubble before it was whole."""
    bubbles = len(texts(driver, ".msg.assistant"))
    driver.execute_script("window.lengths = []")
    send(driver, message)
    assert texts(driver, ".msg.user")[-1] == message
    assert texts(driver, ".msg.assistant .text")[-1] == answer
    seen = driver.execute_script("return window.lengths")
    growing = {
        length
        for n, length, streaming in seen
        if n == bubbles + 1 and streaming and 0 < length < len(answer)
    }
    assert len(growing) >= 2, seen  # at least two partial answers were on screen


def session_id(driver: WebDriver) -> str:
    return str(driver.execute_script("return localStorage.getItem('memchat.session')"))


def stored_messages(admin: psycopg.Connection, session: str) -> int:
    row = admin.execute(
        "select count(*) from public.chat_message_history where session_id = %s",
        (uuid.UUID(session),),
    ).fetchone()
    assert row is not None
    return int(row[0])


# Each answer bubble's thumbs: its message id, data-rating, the active thumbs,
# and whether a rating is on its way.
THUMBS = """
return [...document.querySelectorAll("#log .msg.assistant")].map((b) => ({
  id: b.dataset.messageId || null,
  rating: b.dataset.rating ?? null,
  up: !!b.querySelector(".feedback .thumb-up.active"),
  down: !!b.querySelector(".feedback .thumb-down.active"),
  pending: !!b.dataset.pending,
  note: (b.querySelector(".feedback-note") || {}).textContent || "",
}));
"""

# The stats panel: every [data-stat] value as shown, and #stats' data-state.
STATS = """
const box = document.getElementById("stats");
const shown = { state: box.dataset.state, agent: box.dataset.agent || "" };
for (const el of box.querySelectorAll("[data-stat]")) shown[el.dataset.stat] = el.textContent;
return shown;
"""


def thumbs(driver: WebDriver) -> list[dict[str, Any]]:
    return list(driver.execute_script(THUMBS))


def ratings(driver: WebDriver) -> list[str] | None:
    """Each answer's thumbs as shown: "up", "down" or "" (none active); None
    while a rating is being sent."""
    shown = thumbs(driver)
    if any(t["pending"] for t in shown):
        return None
    for t in shown:
        assert not (t["up"] and t["down"]), shown
        assert t["rating"] == ("1" if t["up"] else "-1" if t["down"] else t["rating"]), shown
        assert t["rating"] in ("1", "-1", "0", ""), shown
    return ["up" if t["up"] else "down" if t["down"] else "" for t in shown]


def click_thumb(driver: WebDriver, answer: int, which: str) -> None:
    bubble = driver.find_elements(By.CSS_SELECTOR, "#log .msg.assistant")[answer]
    bubble.find_element(By.CSS_SELECTOR, f".feedback .thumb-{which}").click()


def wait_ratings(driver: WebDriver, expected: list[str]) -> None:
    wait(driver, f"the thumbs {expected}", lambda d: ratings(d) == expected)


def wait_stats(driver: WebDriver, **expected: int) -> dict[str, str]:
    """Waits for the stats panel to show `expected` (turns=2, sessions_active=1, ...)."""
    want = {key.replace("_", "-"): str(value) for key, value in expected.items()}

    def shown(d: WebDriver) -> dict[str, str] | None:
        stats = d.execute_script(STATS)
        ok = stats["state"] == "ok" and all(stats.get(k) == v for k, v in want.items())
        return stats if ok else None

    return dict(wait(driver, f"the stats panel to show {want}", shown))


def stored_ratings(url: str, bearer: dict[str, str], session: str) -> dict[int, int]:
    """The session's ratings as the API exports them: {answer id: rating}."""
    r = httpx.get(f"{url}/chat/export/{session}", headers=bearer, timeout=10)
    assert r.status_code == 200, r.text
    return {m["id"]: m["feedback"]["rating"] for m in r.json()["messages"] if m.get("feedback")}


def feedback_rows(admin: psycopg.Connection, session: str) -> list[tuple[int, int, str | None]]:
    return [
        (int(message_id), int(rating), comment)
        for message_id, rating, comment in admin.execute(
            "select message_id, rating, comment from memchat.message_feedback"
            " where session_id = %s order by message_id",
            (uuid.UUID(session),),
        ).fetchall()
    ]


REFUSED_MALFORMED = (
    "The access token was refused (unauthorized: The access token is malformed; send it"
    " exactly as Supabase issued it; locally, get a new one with `memchat token`.)."
    ' Paste a new one under "Access token" below.'
)


def auth_banner(driver: WebDriver) -> str | None:
    """The refused-token notice, if shown (and there is only ever one)."""
    shown = driver.execute_script(
        "const a = document.querySelectorAll('#auth');"
        " return a.length === 1 && a[0].classList.contains('shown') ? a[0].textContent : null"
    )
    return None if shown is None else str(shown)


def dialog_open(driver: WebDriver) -> bool:
    return bool(driver.execute_script("return document.getElementById('clear-dialog').open"))


def wait_dialog(driver: WebDriver) -> str:
    """The clear dialog's question, once it is open."""
    wait(driver, "the clear dialog", dialog_open)
    return str(driver.find_element(By.ID, "clear-question").text)


def downloaded(folder: Path) -> Path:
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        done = [p for p in folder.iterdir() if not p.name.endswith(".crdownload")]
        if done:
            return done[0]
        time.sleep(0.1)
    raise AssertionError(f"nothing was downloaded into {folder}: {list(folder.iterdir())}")


# ------------------------------------------------------------------ tests


def test_the_page_streams_answers_keeps_exports_and_clears_the_conversation(
    browser: WebDriver,
    dev: DevServer,
    dev_model: FakeOpenAI,
    downloads: Path,
    admin: psycopg.Connection,
) -> None:
    token = dev.token()
    bearer = {"Authorization": f"Bearer {token}"}
    dev_model.script(
        {"content": FIRST_ANSWER},
        tool_call("append", content="- Likes green tea"),
        {"content": SECOND_ANSWER},
    )
    open_page(browser, f"{dev.url}/#token={token}")

    exchange(browser, "How do I brew green tea?", FIRST_ANSWER)
    metas = texts(browser, ".msg.assistant .meta")
    assert "fake-model" in metas[0] and "0 msgs in context" in metas[0], metas
    assert "context tokens" in metas[0] and "no long-term notes" in metas[0], metas
    exchange(browser, "Remember that I like green tea", SECOND_ANSWER)
    metas = texts(browser, ".msg.assistant .meta")
    assert "2 msgs in context" in metas[1] and "notes updated (append)" in metas[1], metas
    # The notes box was reloaded with the edit the turn stored.
    wait(
        browser,
        "the notes box",
        lambda d: "- Likes green tea" in d.find_element(By.ID, "notes").get_attribute("value"),
    )
    session = session_id(browser)
    assert stored_messages(admin, session) == 6  # 2 turns, one with a tool round

    # Export: a download of the session's JSON, named as the server names it.
    browser.find_element(By.ID, "export").click()
    exported = downloaded(downloads)
    assert exported.name == f"memchat-session-{session}.json"
    body = json.loads(exported.read_text())
    assert body["session"]["id"] == session
    said = [(m["role"], m["content"]) for m in body["messages"] if m["content"]]
    assert ("user", "How do I brew green tea?") in said
    assert ("assistant", FIRST_ANSWER) in said and ("assistant", SECOND_ANSWER) in said

    # A reload shows the conversation again, without the tool round.
    open_page(browser, f"{dev.url}/")
    assert texts(browser, ".msg.user .text") == [
        "How do I brew green tea?",
        "Remember that I like green tea",
    ]
    assert texts(browser, ".msg.assistant .text") == [FIRST_ANSWER, SECOND_ANSWER]
    assert session_id(browser) == session

    # The notes can be edited and saved.
    browser.find_element(By.CSS_SELECTOR, "#notes-box summary").click()
    notes = browser.find_element(By.ID, "notes")
    wait(browser, "the notes", lambda d: notes.get_attribute("value"))
    notes.clear()
    notes.send_keys("- Likes oolong")
    browser.find_element(By.ID, "save-notes").click()
    wait(browser, "the save", lambda d: "Notes saved." in d.find_element(By.ID, "status").text)
    memory = httpx.get(f"{dev.url}/memory", params={"agent_name": "default"}, headers=bearer)
    assert memory.json()["notes"] == "- Likes oolong"

    # Clear asks first, saying what it deletes; Cancel keeps everything.
    browser.find_element(By.ID, "clear").click()
    question = wait_dialog(browser)
    assert question == (
        f"Delete every message of session {session} (4 messages shown here) for good?"
        " Your long-term notes and your other sessions stay."
    )
    browser.find_element(By.ID, "clear-cancel").click()
    wait(browser, "the dialog to close", lambda d: not dialog_open(d))
    assert browser.find_element(By.ID, "status").text == "Not cleared."
    assert stored_messages(admin, session) == 6
    assert len(texts(browser, "#log .msg")) == 4

    # Confirmed: the log empties, the messages are gone, a new session starts.
    browser.find_element(By.ID, "clear").click()
    wait_dialog(browser)
    browser.find_element(By.ID, "clear-confirm").click()
    wait(browser, "the log to empty", lambda d: not texts(d, "#log .msg"))
    assert "Cleared 6 messages" in browser.find_element(By.ID, "status").text
    assert browser.find_element(By.ID, "sid").text.startswith("new session ")
    assert stored_messages(admin, session) == 0
    assert session_id(browser) != session
    old = httpx.get(f"{dev.url}/chat/export/{session}", headers=bearer, timeout=10)
    assert old.status_code == 200 and old.json()["messages"] == []
    open_page(browser, f"{dev.url}/")
    assert texts(browser, "#log .msg") == []


def test_the_page_shows_failures_as_error_lines(
    browser: WebDriver, dev: DevServer, dev_model: FakeOpenAI
) -> None:
    token = dev.token()
    # A session id left by an earlier visit whose session is gone: a fresh start.
    open_page(browser, f"{dev.url}/#token={token}")
    browser.execute_script(
        "localStorage.setItem('memchat.session', arguments[0])", str(uuid.uuid4())
    )
    open_page(browser, f"{dev.url}/")
    assert "gone" in browser.find_element(By.ID, "status").text
    assert browser.find_element(By.ID, "sid").text.startswith("new session ")

    # The model fails mid-answer: an error event.
    dev_model.script({"content": "one two three four five six", "fail_after": 2})
    send(browser, "tell me something")
    errors = texts(browser, ".msg.error")
    assert len(errors) == 1 and errors[0].startswith("model_upstream_error: "), errors
    (partial,) = texts(browser, ".msg.assistant.failed .text")
    assert partial and "one two three four five six".startswith(partial), partial

    # The session goes on.
    send(browser, "still there?")
    assert texts(browser, ".msg.assistant .text")[-1] == "echo: still there?"

    # An HTTP error before any stream (a bad token): said once, above the
    # conversation, pointing at `memchat token`; no error line.
    browser.execute_script("document.getElementById('token').value = 'not-a-token'")
    send(browser, "who am I?")
    assert len(texts(browser, ".msg.error")) == 1
    assert auth_banner(browser) == REFUSED_MALFORMED
    assert texts(browser, ".msg.assistant .text")[-1] == "echo: still there?"


def test_answers_get_thumbs_that_are_stored_restored_and_counted_in_the_stats(
    browser: WebDriver, dev: DevServer, dev_model: FakeOpenAI, admin: psycopg.Connection
) -> None:
    token = dev.token()  # a fresh user: every count starts at 0
    bearer = {"Authorization": f"Bearer {token}"}
    dev_model.script({"content": RATED_ANSWER}, {"content": OTHER_ANSWER})
    open_page(browser, f"{dev.url}/#token={token}")
    browser.find_element(By.CSS_SELECTOR, "#stats-box summary").click()
    wait_stats(browser, turns=0, messages=0, sessions=0, positive=0, negative=0)

    # The panel follows each turn.
    send(browser, "How is oolong brewed?")
    wait_stats(browser, turns=1, messages=2, sessions=1)
    send(browser, "Should I rinse the leaves?")
    shown = wait_stats(browser, turns=2, messages=4, sessions=1, sessions_active=1, positive=0)
    assert int(shown["prompt-tokens"]) > 0 and int(shown["completion-tokens"]) > 0, shown
    assert shown["agent"] == "default"
    assert texts(browser, ".msg.assistant .text") == [RATED_ANSWER, OTHER_ANSWER]
    session = session_id(browser)

    # Each stored answer has thumbs, none active, carrying the answer's id.
    exported = httpx.get(f"{dev.url}/chat/export/{session}", headers=bearer, timeout=10).json()
    first, second = (m["id"] for m in exported["messages"] if m["role"] == "assistant")
    assert [t["id"] for t in thumbs(browser)] == [str(first), str(second)]
    assert ratings(browser) == ["", ""]

    # Up, then down (a switch replaces the rating), then the other answer up.
    click_thumb(browser, 0, "up")
    wait_ratings(browser, ["up", ""])
    wait_stats(browser, positive=1, negative=0, turns=2)
    assert stored_ratings(dev.url, bearer, session) == {first: 1}
    click_thumb(browser, 0, "down")
    wait_ratings(browser, ["down", ""])
    wait_stats(browser, positive=0, negative=1)
    assert stored_ratings(dev.url, bearer, session) == {first: -1}
    assert feedback_rows(admin, session) == [(first, -1, None)]
    click_thumb(browser, 1, "up")
    wait_ratings(browser, ["down", "up"])
    wait_stats(browser, positive=1, negative=1, neutral=0, with_comment=0)
    assert stored_ratings(dev.url, bearer, session) == {first: -1, second: 1}
    assert "(default): 2 turns · 1 good, 1 bad" in browser.find_element(By.ID, "stats-line").text

    # A reload shows the stored ratings, and the same counts.
    open_page(browser, f"{dev.url}/")
    assert ratings(browser) == ["down", "up"]
    assert [t["rating"] for t in thumbs(browser)] == ["-1", "1"]
    wait_stats(browser, turns=2, messages=4, positive=1, negative=1)

    # Clicking the active thumb takes the rating back.
    click_thumb(browser, 0, "down")
    wait_ratings(browser, ["", "up"])
    wait_stats(browser, positive=1, negative=0)
    assert stored_ratings(dev.url, bearer, session) == {second: 1}
    assert feedback_rows(admin, session) == [(second, 1, None)]
    click_thumb(browser, 1, "up")
    wait_ratings(browser, ["", ""])
    wait_stats(browser, positive=0, negative=0)
    assert stored_ratings(dev.url, bearer, session) == {}
    assert feedback_rows(admin, session) == []

    # A rating given elsewhere (the API, with a comment) shows after Refresh,
    # and after a reload; a thumb keeps the comment.
    r = httpx.post(
        f"{dev.url}/chat/feedback",
        json={"message_id": first, "rating": 0, "comment": "fine"},
        headers=bearer,
        timeout=10,
    )
    assert r.status_code == 200, r.text
    browser.find_element(By.CSS_SELECTOR, "#stats-box summary").click()
    browser.find_element(By.ID, "refresh-stats").click()
    wait_stats(browser, neutral=1, with_comment=1, positive=0, negative=0)
    open_page(browser, f"{dev.url}/")
    assert ratings(browser) == ["", ""]
    assert [t["rating"] for t in thumbs(browser)] == ["0", ""]
    assert "fine" in thumbs(browser)[0]["note"]
    click_thumb(browser, 0, "up")
    wait_ratings(browser, ["up", ""])
    wait_stats(browser, positive=1, neutral=0, with_comment=1)
    assert feedback_rows(admin, session) == [(first, 1, "fine")]

    # A rating that fails for a bad token: the refusal is said once (not for
    # the rating, the stats and the sessions each); the thumbs stay.
    browser.execute_script("document.getElementById('token').value = 'not-a-token'")
    click_thumb(browser, 1, "down")
    wait(browser, "the stats to fail", lambda d: d.execute_script(STATS)["state"] == "error")
    wait_ratings(browser, ["up", ""])
    assert auth_banner(browser) == REFUSED_MALFORMED
    assert texts(browser, ".msg.error") == []
    assert "unauthorized" not in browser.find_element(By.ID, "status").text
    assert feedback_rows(admin, session) == [(first, 1, "fine")]


def test_new_starts_a_new_session_and_going_back_to_one_is_explicit(
    browser: WebDriver, dev: DevServer, dev_model: FakeOpenAI, admin: psycopg.Connection
) -> None:
    token = dev.token()
    open_page(browser, f"{dev.url}/#token={token}")
    first_shown = browser.find_element(By.ID, "sid").text
    assert first_shown.startswith("new session ")
    send(browser, "in the first session")
    first = session_id(browser)
    assert browser.find_element(By.ID, "sid").text == f"session {first}"
    assert first_shown == f"new session {first}"  # the id shown is the one used

    # New: a new id, even though the first session is the agent's active one.
    browser.find_element(By.ID, "new").click()
    shown = browser.find_element(By.ID, "sid").text
    assert shown.startswith("new session ") and first not in shown
    assert texts(browser, "#log .msg") == []
    send(browser, "in the second session")
    second = session_id(browser)
    assert second != first and shown == f"new session {second}"
    assert (stored_messages(admin, first), stored_messages(admin, second)) == (2, 2)

    # A reload shows the session it showed, not the agent's active one.
    open_page(browser, f"{dev.url}/")
    assert browser.find_element(By.ID, "sid").text == f"session {second}"
    assert texts(browser, ".msg.user .text") == ["in the second session"]

    # Going back to the first one: chosen in the Sessions list.
    options = wait(
        browser,
        "the sessions list",
        lambda d: d.execute_script(
            "const o = [...document.querySelectorAll('#sessions option')].slice(1);"
            " return o.length === 2 ? o.map((e) => [e.value, e.textContent]) : null"
        ),
    )
    assert [value for value, _ in options] == [second, first]
    assert options[0][1].endswith(" (shown)") and " · 2 messages · " in options[1][1]
    browser.execute_script(
        "const s = document.getElementById('sessions'); s.value = arguments[0];"
        " s.dispatchEvent(new Event('change'))",
        first,
    )
    wait(
        browser,
        "the first session",
        lambda d: texts(d, ".msg.user .text") == ["in the first session"],
    )
    assert browser.find_element(By.ID, "sid").text == f"session {first}"
    send(browser, "back in the first")
    assert (stored_messages(admin, first), stored_messages(admin, second)) == (4, 2)


# Every element's box, where it overflows the viewport's width.
OVERFLOW = """
const width = document.documentElement.clientWidth;
return {
  width, inner: window.innerWidth, scroll: document.documentElement.scrollWidth,
  over: [...document.querySelectorAll("body *")]
    .filter((e) => e.getClientRects().length && e.getBoundingClientRect().right > width + 0.5)
    .map((e) => `${e.tagName.toLowerCase()}#${e.id}.${e.className}`),
};
"""


def test_the_page_fits_a_360_pixel_wide_viewport(
    browser: WebDriver, dev: DevServer, dev_model: FakeOpenAI
) -> None:
    browser.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride",
        {"width": 360, "height": 740, "deviceScaleFactor": 2, "mobile": True},
    )
    dev_model.script({"content": "a fairly long answer " * 12})
    open_page(browser, f"{dev.url}/#token={dev.token()}")
    send(browser, "a message with a long word: " + "x" * 80)
    for summary in browser.find_elements(By.CSS_SELECTOR, "details summary"):
        summary.click()  # the notes, the stats and the token box open
    wait(browser, "the stats", lambda d: d.execute_script(STATS)["state"] == "ok")
    measured = browser.execute_script(OVERFLOW)
    assert measured["inner"] == 360, measured
    assert measured["scroll"] <= measured["width"], measured
    assert measured["over"] == [], measured
    # The clear dialog fits too.
    browser.find_element(By.ID, "clear").click()
    wait_dialog(browser)
    assert browser.execute_script(OVERFLOW)["over"] == []


def test_icon_thumbs_and_counts_need_no_emoji_font_and_no_404(
    browser: WebDriver, dev: DevServer, dev_model: FakeOpenAI
) -> None:
    icon = httpx.get(f"{dev.url}/favicon.ico", timeout=10)
    assert icon.status_code == 200 and icon.headers["content-type"] == "image/svg+xml"
    assert icon.text.startswith("<svg ")
    open_page(browser, f"{dev.url}/#token={dev.token()}")
    browser.find_element(By.CSS_SELECTOR, "#stats-box summary").click()
    send(browser, "one turn")
    wait_stats(browser, turns=1)
    line = browser.find_element(By.ID, "stats-line").text
    assert line == "(default): 1 turn · 0 good, 0 bad", line
    meta = texts(browser, ".msg.assistant .meta")[0]
    assert "0 msgs in context" in meta, meta

    # The thumbs are drawn (inline SVG), and nothing on the page is an emoji.
    drawn = browser.execute_script(
        "return [...document.querySelectorAll('.thumb')].map((b) =>"
        " [b.querySelectorAll('svg path').length, b.textContent, b.getAttribute('aria-label')])"
    )
    assert drawn == [[1, "", "Good answer"], [1, "", "Bad answer"]]
    page = str(browser.execute_script("return document.documentElement.outerHTML"))
    assert [c for c in page if ord(c) >= 0x2190 and c not in "–“”…"] == []

    # The page asked for its icon, and nothing it loaded was missing.
    loaded = browser.execute_script("return fetch('/favicon.svg').then((r) => r.status)")
    assert loaded == 200
    missing = [e for e in browser.get_log("browser") if "404" in e["message"]]
    assert missing == [], missing


@pytest.fixture(scope="module")
def offline_dev(admin_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevServer]:
    """`memchat dev` with no model key: the offline responder answers (and
    suggests follow-ups, which `memchat dev` shows then unless SUGGESTIONS=0)."""
    with dev_server(admin_url, tmp_path_factory.mktemp("offline-dev")) as running:
        yield running


def test_suggested_follow_ups_are_buttons_that_send_them(
    browser: WebDriver, offline_dev: DevServer, admin: psycopg.Connection
) -> None:
    token = offline_dev.token()
    open_page(browser, f"{offline_dev.url}/#token={token}")
    send(browser, "I am planning a trip to Lisbon in spring")
    wait(browser, "the suggestions", lambda d: texts(d, ".suggestions .suggestion"))
    offered = texts(browser, ".suggestions .suggestion")
    assert len(offered) == 3 and all("Lisbon" in text for text in offered), offered
    browser.find_elements(By.CSS_SELECTOR, ".suggestions .suggestion")[0].click()
    wait(
        browser,
        "the follow-up's answer",
        lambda d: (
            len(texts(d, ".msg.assistant")) == 2
            and not d.find_elements(By.CSS_SELECTOR, ".msg.assistant.streaming")
        ),
    )
    assert texts(browser, ".msg.user .text") == [
        "I am planning a trip to Lisbon in spring",
        offered[0],
    ]
    # Never stored as messages: the session holds the two turns only.
    assert stored_messages(admin, session_id(browser)) == 4
    # The follow-up's own follow-ups: never the question just sent.
    wait(browser, "new suggestions", lambda d: texts(d, ".suggestions .suggestion"))
    assert offered[0] not in texts(browser, ".suggestions .suggestion")


def memory_texts(driver: WebDriver) -> list[str]:
    return [
        str(text)
        for text in driver.execute_script(
            "return [...document.querySelectorAll('#memories li .memory-text')]"
            ".map((e) => e.firstChild.textContent)"
        )
    ]


def test_the_memory_view_lists_searches_and_forgets_memories(
    browser: WebDriver,
    dev: DevServer,
    dev_model: FakeOpenAI,
    admin: psycopg.Connection,
    worker_url: str,
) -> None:
    user_id = uuid.uuid4()
    open_page(browser, f"{dev.url}/#token={dev.token(user_id)}")
    dev_model.script({"content": "Noted."}, {"content": "Noted again."})
    send(browser, "I keep bees on my balcony in Lisbon.")
    send(browser, "My sister Ana is a marine biologist.")
    embedder = bootstrap.embedder(make_settings(worker_url, dev_model.url, job="summaries"))

    async def backfill() -> None:
        try:
            await embedder.run()
        finally:
            await embedder.close()

    asyncio.run(backfill())
    browser.find_element(By.CSS_SELECTOR, "#memories-box summary").click()
    wait(browser, "the memories", lambda d: len(memory_texts(d)) == 2)
    assert memory_texts(browser) == [
        "My sister Ana is a marine biologist.",
        "I keep bees on my balcony in Lisbon.",
    ]
    meta = texts(browser, "#memories li .memory-meta")
    assert all(m.startswith("you said · ") and " · kept until " in m for m in meta)
    # A search shows the one about bees first.
    browser.find_element(By.ID, "memories-q").send_keys("bees balcony")
    browser.find_element(By.ID, "memories-find").click()
    wait(
        browser,
        "the search",
        lambda d: (memory_texts(d) or [""])[0] == "I keep bees on my balcony in Lisbon.",
    )
    # Forget it: gone from the page and from the database, for good.
    browser.find_element(By.CSS_SELECTOR, "#memories li button.forget").click()
    wait(
        browser,
        "the memory to go",
        lambda d: "I keep bees on my balcony in Lisbon." not in memory_texts(d),
    )
    left = admin.execute(
        "select text from memchat.memories where user_id = %s", (user_id,)
    ).fetchall()
    assert left == [("My sister Ana is a marine biologist.",)]
    assert "Forgotten: I keep bees" in browser.find_element(By.ID, "status").text
