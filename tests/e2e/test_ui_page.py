"""The operator's page (``GET /``, controller/interfaces/ui) in a browser, and ``GET /v1/plans``.

Two layers:

* against the ASGI app (no Docker, no browser): the page and its assets are served
  from the package with a strict Content-Security-Policy and no outside URL;
  ``/v1/plans`` shows the journal's last plans, newest first, with each step's
  outcome, and withholds failure text from a reader without the token;
* Debian's chromium, headless, driven by Playwright, on the page of ``vramctl run``
  in a subprocess over real busybox containers (the harness of test_api.py): the
  bars' numbers are those of ``/v1/ledger`` for the same cycle, an eviction made
  through the API shows on the open page without a reload, and NVML - absent on
  this machine - is shown as unknown, never 0. The eviction test leaves a
  screenshot; with ``VRAMCTL_UI_SCREENSHOT=PATH`` it is written there too (that is
  how docs/ui.png is made).
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support.waiting import WAIT_S, wait_for
from test_api import (  # noqa: F401
    TOKEN,
    Asgi,
    Live,
    calm,
    client,
    controller_of,
    idle,
    live,
    observe,
)

from controller.interfaces.ui import ASSETS
from controller.service.loop import Controller

CHROMIUM = os.environ.get("VRAMCTL_CHROMIUM", "/usr/bin/chromium")
#: a wait of the page's own (playwright's, in ms): a last resort, as tests/support/waiting.py
WAIT_MS = int(WAIT_S * 1000)
IN_CI = os.environ.get("CI", "").strip().lower() in {"true", "1", "yes"}

# ── the ASGI app ─────────────────────────────────────────────────────────────


def test_page_and_assets_are_served_from_the_package(
    idle: Controller, client: Callable[..., Asgi]
) -> None:
    api = client(idle, token=None)
    page = api.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    csp = page.headers["content-security-policy"]
    assert "default-src 'none'" in csp and "script-src 'self'" in csp
    assert "connect-src 'self'" in csp and "frame-ancestors 'none'" in csp
    assert page.headers["x-content-type-options"] == "nosniff"
    for name in ASSETS:
        body = api.get("/" if name == "index.html" else f"/ui/{name}")
        assert body.status_code == 200, name
        assert body.headers["content-type"].startswith(ASSETS[name].split(";")[0])
        # nothing from outside: a serving host may be offline
        assert "http://" not in body.text and "https://" not in body.text, name
        assert not re.search(r"""(?:src|href)=["']//""", body.text), name
    assert '<script src="/ui/app.js">' in page.text
    assert api.get("/ui/../api.py").status_code == 404
    assert api.get("/ui/index.py").status_code == 404


def _record(controller: Controller, at: float, steps: list[dict[str, Any]]) -> int:
    plan = {
        "steps": [{k: v for k, v in s.items() if k not in ("outcome", "detail")} for s in steps],
        "blocked": [{"serve": "big", "reason": "big is held back: up failed: /opt/secret-up"}],
        "notes": [],
    }
    cycle = controller.journal.record_cycle(
        at=at,
        manifest_digest="d" * 64,
        manifest_files={},
        observed={"docker": "ok"},
        plan=plan,
        requests=[],
        dry_run=False,
    )
    report = {
        "ok": all(s["outcome"] == "ok" for s in steps),
        "preflight": [],
        "stopped_early": False,
        "steps": [{**s, "duration_s": 0.25} for s in steps],
    }
    controller.journal.record_outcome(cycle, report)
    return cycle


#: two cards with a resident on each; a resident placed on either fits on neither
TWO_CARDS = """
[[gpu_roles]]
id = "a"
vram_mib = 10000
reserve_mib = 1000

[[gpu_roles]]
id = "b"
vram_mib = 10000
reserve_mib = 1000

[[serve]]
name = "ra"
container = "c-ra"
gpu_role = "a"
vram_mib = 6000
residency = "resident"
desired = "running"

[[serve]]
name = "rb"
container = "c-rb"
gpu_role = "b"
vram_mib = 5000
residency = "resident"
desired = "running"

[[serve]]
name = "big"
container = "c-big"
placement = ["a", "b"]
vram_mib = 7000
residency = "resident"
desired = "running"
"""


def test_a_placed_serve_blocked_everywhere_names_every_candidate_with_its_arithmetic(
    tmp_path: Path, client: Callable[..., Asgi]
) -> None:
    """The serves table's blocked cell (GET /v1/serves's ``blocked``, drawn as it is):
    big starts on neither card, and the reason gives each card's terms, not only those
    of the card it waits on."""
    with controller_of(tmp_path, TWO_CARDS) as controller:
        running = {"state": "running", "health": "healthy"}
        observe(controller, {"ra": running, "rb": running, "big": {"state": "exited"}})
        r = client(controller).get("/v1/serves", headers={"Authorization": f"Bearer {TOKEN}"})
        assert r.status_code == 200, r.text
        why = {s["serve"]: s["blocked"] for s in r.json()["serves"]}["big"]
    assert why is not None and why.startswith("big starts on none of its candidates (a, b)")
    for card, committed, free, short in (("a", 6000, 3000, 4000), ("b", 5000, 4000, 3000)):
        terms = (
            f"{card}: capacity 10000 - reserve 1000 = budget 9000; committed {committed} "
            f"(r{card} {committed}); free {free}; needs 7000; short {short}"
        )
        assert terms in why, why


def test_plans_are_the_journals_newest_first_and_redacted_without_the_token(
    idle: Controller, client: Callable[..., Asgi]
) -> None:
    step = {"gpu_roles": ["a"], "mib": 3000, "group": "res"}
    first = _record(
        idle,
        1000.0,
        [
            {
                **step,
                "action": "reserve",
                "serve": "res",
                "reason": "r",
                "outcome": "ok",
                "detail": "reserved",
            },
            {
                **step,
                "action": "start",
                "serve": "res",
                "reason": "s",
                "outcome": "failed",
                "detail": "up command `/opt/secret-up --key k` exited 3: boom",
            },
        ],
    )
    second = _record(
        idle,
        2000.0,
        [
            {
                **step,
                "action": "stop",
                "serve": "omni",
                "reason": "evict",
                "outcome": "failed",
                "detail": "container exited 137",
            }
        ],
    )
    api = client(idle)
    plans = api.get("/v1/plans").json()
    assert plans["detail"] == "redacted"
    assert [p["cycle"] for p in plans["plans"]] == [second, first]
    old = plans["plans"][1]
    assert [(s["action"], s["serve"], s["outcome"], s["duration_s"]) for s in old["steps"]] == [
        ("reserve", "res", "ok", 0.25),
        ("start", "res", "failed", 0.25),
    ]
    assert old["outcome"]["ok"] is False
    # free text is withheld without the token; states and figures are kept
    assert old["steps"][1]["detail"] is None and "secret" not in str(plans)
    assert plans["plans"][0]["steps"][0]["detail"] == "container exited 137"
    assert old["blocked"][0]["reason"].startswith("big is held back (the reason is shown")
    full = api.get("/v1/plans", headers={"Authorization": f"Bearer {TOKEN}"}).json()
    assert full["detail"] == "full"
    assert "/opt/secret-up --key k" in full["plans"][1]["steps"][1]["detail"]
    assert api.get("/v1/plans", headers={"Authorization": "Bearer nope"}).status_code == 403
    assert [p["cycle"] for p in api.get("/v1/plans?limit=1").json()["plans"]] == [second]
    for bad in ("0", "101", "x"):
        assert api.get(f"/v1/plans?limit={bad}").status_code == 422


# ── the browser ──────────────────────────────────────────────────────────────


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not Path(CHROMIUM).exists():
        message = f"no chromium at {CHROMIUM}: tests/ensure-tools.sh installs Debian's chromium"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(
            executable_path=CHROMIUM,
            headless=True,
            args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
        )
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def page(browser: Any, calm: Live) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    pg = context.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.goto(calm.url + "/")
    pg.wait_for_selector("[data-role='a'] [data-field='committed_mib']", timeout=WAIT_MS)
    try:
        yield pg
    finally:
        context.close()
    assert not errors, errors


def _drawn(pg: Any) -> dict[str, Any]:
    """What the page shows now: the cycle it drew, and each role's figures and segments."""
    return dict(
        pg.evaluate(
            """() => ({
        observed_at: document.body.dataset.observedAt,
        cycles: document.body.dataset.cycles,
        roles: [...document.querySelectorAll('[data-role]')].map((r) => ({
          role: r.dataset.role,
          figures: Object.fromEntries([...r.querySelectorAll('.figures [data-field]')]
            .map((f) => [f.dataset.field, f.textContent])),
          segments: [...r.querySelectorAll('[data-serve]')]
            .map((s) => [s.dataset.serve, s.dataset.mib]),
          free: (r.querySelector('[data-segment=free]') || {dataset: {}}).dataset.mib || null,
          reserve: r.querySelector('[data-segment=reserve]').dataset.mib,
          nvml: !!r.querySelector('[data-segment=nvml-used]'),
        })),
        lifecycles: Object.fromEntries([...document.querySelectorAll('[data-serve-row]')]
          .map((tr) => [tr.dataset.serveRow,
                        tr.querySelector('[data-field=lifecycle]').textContent])),
      })"""
        )
    )


def _same_moment(pg: Any, lv: Live) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The page's drawing and the API's answers for the cycle the page drew."""

    def same() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]] | None:
        drawn = _drawn(pg)
        ledger = lv.http.get("/v1/ledger").json()
        serves = lv.http.get("/v1/serves").json()
        if drawn["observed_at"] == str(ledger["observed_at"]) == str(serves["observed_at"]):
            return drawn, ledger, serves
        return None

    return wait_for("the page to show the cycle the API answered for", same)


def _text(value: Any) -> str:
    return "unknown" if value is None else str(value)


@pytest.mark.docker
@pytest.mark.browser
def test_the_bars_numbers_equal_the_ledger(page: Any, calm: Live) -> None:
    drawn, ledger, serves = _same_moment(page, calm)
    assert len(drawn["roles"]) == len(ledger["gpu_roles"]) == 1
    for shown, role in zip(drawn["roles"], ledger["gpu_roles"], strict=True):
        assert shown["role"] == role["gpu_role"]
        for field in (
            "capacity_mib",
            "reserve_mib",
            "budget_mib",
            "committed_mib",
            "free_mib",
            "nvml_used_mib",
            "nvml_total_mib",
        ):
            assert shown["figures"][field] == _text(role[field]), field
        drift = role["drift_used_mib"]
        assert shown["figures"]["drift_used_mib"] == (
            "unknown" if drift is None else ("+" if drift > 0 else "") + str(drift)
        )
        assert shown["segments"] == [[r["serve"], str(r["mib"])] for r in role["reservations"]]
        assert shown["free"] == str(role["free_mib"])
        assert shown["reserve"] == str(role["reserve_mib"])
    # the calm host: res + omni hold 7000 of the budget of 9000
    assert drawn["roles"][0]["segments"] == [["omni", "4000"], ["res", "3000"]]
    assert drawn["roles"][0]["figures"]["committed_mib"] == "7000"
    assert drawn["lifecycles"] == {s["serve"]: s["lifecycle"] for s in serves["serves"]}


_LABELS = """() => [...document.querySelectorAll('#roles .seg-label')].map((l) => ({
  text: l.textContent, hidden: l.hidden,
  cut: l.offsetLeft + l.offsetWidth > l.parentElement.clientWidth }))"""


def _labels_once(page: Any, redrawn: Callable[[list[dict[str, Any]]], bool]) -> list[Any]:
    """The bar labels, once the page has redrawn them for its new size (``redrawn``)."""
    seen: list[Any] = []

    def read() -> bool:
        seen[:] = page.evaluate(_LABELS)
        return redrawn(seen)

    wait_for("the labels redrawn for the new size", read, seen=lambda: seen)
    return seen


@pytest.mark.docker
@pytest.mark.browser
def test_a_bar_label_shows_whole_or_not_at_all(page: Any, calm: Live) -> None:
    # narrow: the reserve's 1000 of 10000 MiB is ~50 px, too narrow for "reserve 1000"
    page.set_viewport_size({"width": 520, "height": 900})
    labels = _labels_once(page, lambda ls: any(x["hidden"] for x in ls))  # redrawn narrow
    assert [x["text"] for x in labels if x["cut"] and not x["hidden"]] == [], labels
    assert "reserve 1000" in [x["text"] for x in labels if x["hidden"]], labels
    # wide again: each label that fits shows again
    page.set_viewport_size({"width": 1280, "height": 900})
    labels = _labels_once(page, lambda ls: not any(x["hidden"] for x in ls if not x["cut"]))
    assert "reserve 1000" in [x["text"] for x in labels if not x["hidden"]], labels


@pytest.mark.docker
@pytest.mark.browser
def test_the_page_works_with_nvml_unknown(page: Any, calm: Live) -> None:
    health = calm.http.get("/healthz").json()
    assert health["nvml"] == "unavailable"  # no GPU on this machine
    drawn, ledger, _ = _same_moment(page, calm)
    figures = drawn["roles"][0]["figures"]
    for field in ("nvml_used_mib", "nvml_total_mib", "drift_used_mib"):
        assert ledger["gpu_roles"][0][field] is None
        assert figures[field] == "unknown", field
    assert not drawn["roles"][0]["nvml"]  # no overlay drawn from an unknown figure
    assert "NVML unavailable" in page.text_content("[data-notice=nvml]")
    assert page.text_content("#health [data-field=nvml]") == "unavailable"
    # every figure that is known is drawn: the ledger's own still are
    assert figures["committed_mib"] == str(ledger["gpu_roles"][0]["committed_mib"])


@pytest.mark.docker
@pytest.mark.browser
def test_the_token_shows_full_detail_and_a_reader_without_it_still_sees_everything_else(
    page: Any, calm: Live
) -> None:
    page.wait_for_selector("#detail[data-detail='redacted']")
    page.fill("#token", TOKEN)
    page.click("#token-form button[type=submit]")
    page.wait_for_selector("#detail[data-detail='full']", timeout=WAIT_MS)
    assert page.input_value("#token") == ""  # not left on the screen
    page.fill("#token", "wrong-token")
    page.click("#token-form button[type=submit]")
    page.wait_for_selector("#conn[data-state='error']", timeout=WAIT_MS)
    assert "403" in page.text_content("#conn")
    page.click("#token-clear")
    page.wait_for_selector("#detail[data-detail='redacted']", timeout=WAIT_MS)
    page.wait_for_selector("#conn[data-state='live']", timeout=WAIT_MS)


@pytest.mark.docker
@pytest.mark.browser
def test_an_eviction_made_through_the_api_shows_without_a_reload(
    page: Any, calm: Live, tmp_path: Path
) -> None:
    lv = calm
    page.evaluate("() => { window.__sameDocument = true; }")
    page.wait_for_selector("[data-role='a'] [data-serve='omni']")
    assert page.query_selector("[data-role='a'] [data-serve='llm']") is None
    r = lv.post("/v1/serves/llm/up", {"ttl_s": 300})
    assert r.status_code == 202, r.text
    # the page follows by itself: omni is evicted, llm holds its 5000 MiB
    page.wait_for_selector("[data-role='a'] [data-serve='llm'][data-mib='5000']", timeout=WAIT_MS)
    page.wait_for_selector("[data-role='a'] [data-serve='omni']", state="detached", timeout=WAIT_MS)
    wait_for("llm running", lambda: lv.serves()["llm"]["lifecycle"] == "running")
    page.wait_for_function(
        "() => document.querySelector(\"[data-serve-row='llm'] [data-field=lifecycle]\")"
        ".textContent === 'running'",
        timeout=WAIT_MS,
    )
    assert page.evaluate("() => window.__sameDocument === true"), "the page was reloaded"
    # the rows say why: llm runs on its request, omni was evicted for it
    page.wait_for_function(
        "() => document.querySelector(\"[data-serve-row='omni'] [data-field=desired]\")"
        ".textContent === 'running (evicted for llm)'",
        timeout=WAIT_MS,
    )
    assert page.text_content("[data-serve-row='llm'] [data-field=desired]") == "running (request)"
    served = lv.serves()
    assert (served["llm"]["desired"], served["llm"]["desired_by"]) == ("running", "request")
    assert served["omni"]["evicted_for"] == ["llm"] and served["res"]["evicted_for"] == []
    drawn, ledger, _ = _same_moment(page, lv)
    assert drawn["roles"][0]["segments"] == [
        [x["serve"], str(x["mib"])] for x in ledger["gpu_roles"][0]["reservations"]
    ]
    assert "expires in" in page.text_content("[data-serve-row='llm'] [data-field=request]")
    # the plan that evicted omni is listed, with its outcomes
    page.wait_for_function(
        """() => [...document.querySelectorAll('.plan li')].some((li) =>
             li.textContent.includes('stop omni') && li.className === 'outcome-ok')""",
        timeout=WAIT_MS,
    )
    shot = tmp_path / "ui.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    target = os.environ.get("VRAMCTL_UI_SCREENSHOT")
    if target:
        shutil.copyfile(shot, target)
    assert lv.post("/v1/serves/llm/down").status_code == 202
    page.wait_for_selector("[data-role='a'] [data-serve='omni']", timeout=WAIT_MS)
    wait_for("omni back", lambda: lv.state("omni") == "running")
