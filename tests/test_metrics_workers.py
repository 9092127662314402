"""``/metrics`` of ``serve --workers N`` speaks for all N processes, whichever one the kernel hands the scrape.

The workers share one port (SO_REUSEPORT), so each scrape lands on any of them; a counter must read the same
total on every scrape, not the count of whichever process answered.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.replica import Replica
from tests.support import ALICE, pins
from workflow_streams import API_PREFIX

pytestmark = pytest.mark.slow

RUN = "metrics-workers"
# each on its own connection: the kernel spreads them over both workers (all on one has odds 2 ** -29)
APPENDS = 30
SCRAPES = 12


@pytest.fixture
async def server(database_url: str, tmp_path: Path) -> AsyncIterator[Replica]:
    replica = Replica(database_url, tmp_path / "server.log", WFS_REGION="eu-west-1", WFS_WORKERS="2")
    try:
        await replica.ready()
        yield replica
    finally:
        replica.stop()


def _fresh_connection(headers: dict[str, str] | None = None) -> aiohttp.ClientSession:
    """A session whose every request opens a new TCP connection, so the kernel picks a worker each time."""
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True), headers=headers)


async def _scrape(replica: Replica) -> dict[str, float]:
    async with _fresh_connection() as session, session.get(f"{replica.base}/metrics") as resp:
        assert resp.status == 200
        text = await resp.text()
    return {
        sample.name + str(sorted(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def _appended(scrape: dict[str, float]) -> float:
    return sum(v for k, v in scrape.items() if k.startswith("wfs_appended_records_total["))


async def test_every_scrape_counts_the_appends_of_every_worker(server: Replica) -> None:
    streams = f"{server.base}{API_PREFIX}/runs/{RUN}/streams"
    async with _fresh_connection(headers=ALICE) as session:
        async with session.post(streams, json={"stream_id": "s", "pins": pins()}) as resp:
            assert resp.status == 201, await resp.text()
        for i in range(APPENDS):
            async with session.post(f"{streams}/s/records", json={"data": i}) as resp:
                assert resp.status == 201, await resp.text()

    scrapes = [await _scrape(server) for _ in range(SCRAPES)]
    assert [_appended(s) for s in scrapes] == [float(APPENDS)] * SCRAPES
    # the requests counter is summed the same way: every scrape has seen all the appends' POSTs
    posts = [
        sum(v for k, v in s.items() if k.startswith("wfs_http_requests_total[") and "'POST'" in k and "'201'" in k)
        for s in scrapes
    ]
    assert posts == [float(APPENDS + 1)] * SCRAPES
