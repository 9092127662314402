"""How `serve` is told about its Postgres (config): the pooler mode, the LISTEN DSN and the deadline, and the
one combination refused at start-up (LISTEN through a transaction pooler receives nothing)."""

from __future__ import annotations

import pytest

from workflow_streams.adapters.config import Settings
from workflow_streams.store.db import Connecting

pytestmark = pytest.mark.unit

BASE = {"WFS_DATABASE_URL": "postgresql://u@pooler:6432/wfs"}


def test_direct_by_default_with_listen_and_a_five_second_deadline() -> None:
    settings = Settings.from_env(BASE)
    assert settings.connecting == Connecting(pooler="none", timeout_seconds=5.0)
    assert settings.wake_source == "listen"
    assert settings.listen_url == BASE["WFS_DATABASE_URL"]
    assert settings.connecting.connect_arguments("x")["server_settings"] == {"application_name": "x", "TimeZone": "UTC"}


def test_a_transaction_pooler_polls_unless_given_a_direct_dsn_for_listen() -> None:
    pooled = Settings.from_env({**BASE, "WFS_DATABASE_POOLER": "transaction", "WFS_DATABASE_TIMEOUT_SECONDS": "2"})
    assert pooled.wake_source == "poll" and pooled.head_poll_seconds == 0.2
    assert pooled.connecting.timeout_seconds == 2.0
    # nothing is kept prepared between transactions
    assert pooled.connecting.connect_arguments("x")["statement_cache_size"] == 0

    direct = "postgresql://u@primary:5432/wfs"
    listening = Settings.from_env({**BASE, "WFS_DATABASE_POOLER": "transaction", "WFS_LISTEN_DATABASE_URL": direct})
    assert listening.wake_source == "listen" and listening.listen_url == direct


def test_listen_through_a_transaction_pooler_is_refused_at_start() -> None:
    with pytest.raises(SystemExit, match="WFS_LISTEN_DATABASE_URL"):
        Settings.from_env({**BASE, "WFS_DATABASE_POOLER": "transaction", "WFS_WAKE_SOURCE": "listen"})
    with pytest.raises(SystemExit, match="WFS_DATABASE_POOLER must be one of none, transaction"):
        Settings.from_env({**BASE, "WFS_DATABASE_POOLER": "session"})
