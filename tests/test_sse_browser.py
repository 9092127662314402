"""A real browser's EventSource: receives records, survives a server-side drop, resumes exactly once."""

from __future__ import annotations

import shutil
from typing import Any

import pytest
from aiohttp import web

from tests.support import StreamsApi
from workflow_streams.api.events import close_open_streams
from workflow_streams.shells.compose import create_app

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = [
    pytest.mark.slow,  # starts Chromium
    pytest.mark.skipif(CHROMIUM is None, reason="Debian chromium is not installed (scripts/bootstrap)"),
]

PAGE = """<!doctype html>
<title>subscriber</title>
<script>
  window.received = []; window.opens = 0; window.errors = 0;
  const es = new EventSource("/api/workflow-streams/runs/r/streams/s/subscribe?after=0&access_token=tok-alice");
  es.addEventListener("record", (e) => window.received.push(Number(e.lastEventId)));
  es.onopen = () => { window.opens += 1; };
  es.onerror = () => { window.errors += 1; };
</script>
"""


async def _page(request: web.Request) -> web.Response:
    return web.Response(text=PAGE, content_type="text/html")


async def test_browser_reconnects_with_last_event_id(aiohttp_client: Any, database_url: str, settings_for: Any) -> None:
    from playwright.async_api import async_playwright

    if CHROMIUM is None:
        pytest.fail("Debian chromium is not installed: scripts/bootstrap installs it")

    app = create_app(settings_for(database_url))
    app.router.add_get("/subscriber.html", _page)
    resume_ids: list[str | None] = []  # Last-Event-ID of each subscribe, as the server saw it

    async def note_resume(request: web.Request, response: web.StreamResponse) -> None:
        if request.path.endswith("/subscribe"):
            resume_ids.append(request.headers.get("Last-Event-ID"))

    app.on_response_prepare.append(note_resume)
    client = await aiohttp_client(app)
    api = StreamsApi(client)
    await api.create("r", "s")
    await api.append("r", "s", *range(5))

    async with async_playwright() as pw:
        browser = await pw.chromium.launch(
            executable_path=CHROMIUM,
            headless=True,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
            ],
        )
        try:
            page = await browser.new_page()
            await page.goto(str(client.make_url("/subscriber.html")))
            await page.wait_for_function("window.received.length >= 5", timeout=15_000)

            await close_open_streams(app)  # the server drops every open subscription
            await page.wait_for_function("window.errors >= 1", timeout=15_000)
            await api.append("r", "s", *range(5, 8))
            await api.append("r", "s", 8, 9)
            await page.wait_for_function("window.opens >= 2 && window.received.length >= 10", timeout=15_000)
            # one record more: the connection is ordered, so a duplicate of 1..10 would arrive before it
            await api.append("r", "s", 11)
            await page.wait_for_function("window.received.includes(11)", timeout=15_000)

            received = await page.evaluate("window.received")
            assert received == list(range(1, 12)), received
            assert resume_ids == [None, "5"], f"one reconnect, resuming after the last id: {resume_ids}"
        finally:
            await browser.close()
