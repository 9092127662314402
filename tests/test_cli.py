"""The CLI against a real data plane process: every command, ``--json``, and one-line errors."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from tests.replica import Replica
from tests.support import pins
from workflow_streams.local.postgres import free_port
from workflow_streams.shells.cli import build_parser

pytestmark = pytest.mark.slow


def cli(*args: str, env: dict[str, str] | None = None, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "workflow_streams", *args],
        capture_output=True,
        text=True,
        timeout=120,
        input=stdin,
        env={**os.environ, **(env or {})},
    )


async def acli(
    *args: str, env: dict[str, str] | None = None, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(cli, *args, env=env, stdin=stdin)


def on_a_terminal(*args: str, env: dict[str, str]) -> tuple[int, str, str]:
    """Run with stderr on a pseudo-terminal, where progress bars and countdowns draw."""
    import fcntl
    import pty
    import struct
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))  # a 0-column bar draws nothing
    proc = subprocess.Popen(
        [sys.executable, "-m", "workflow_streams", *args],
        stdout=subprocess.PIPE,
        stderr=slave,
        env={**os.environ, **env},
    )
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    assert proc.stdout is not None
    with proc.stdout:
        stdout = proc.stdout.read().decode()
    return proc.wait(60), stdout, b"".join(chunks).decode(errors="replace")


def one_line_error(result: subprocess.CompletedProcess[str], code: str) -> None:
    """Exit status 1, nothing on stdout, exactly one line on stderr naming the problem's code."""
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ") and code in lines[0], lines[0]


@pytest.fixture
async def server(database_url: str, tmp_path: Path, s3_regions: Any) -> AsyncIterator[Replica]:
    regions = {name: dataclasses.asdict(cfg) for name, cfg in s3_regions.items()}
    replica = Replica(database_url, tmp_path / "server.log", WFS_REGION="eu-west-1", WFS_S3_REGIONS=json.dumps(regions))
    async with aiohttp.ClientSession() as session:
        await replica.ready(session)
    yield replica
    replica.stop()


@pytest.fixture
def env(server: Replica) -> dict[str, str]:
    return {"WFS_URL": server.base, "WFS_TOKEN": "tok-alice"}


async def test_every_stream_command_with_json(server: Replica, env: dict[str, str], tmp_path: Path) -> None:
    (tmp_path / "pins.yaml").write_text(yaml.safe_dump(pins()))
    created = await acli("create", "run", "s", "--pins", str(tmp_path / "pins.yaml"), "--json", env=env)
    assert created.returncode == 0, created.stderr
    assert json.loads(created.stdout)["stream_id"] == "s"
    again = await acli("create", "run", "s", "--pins", "-", env=env, stdin=json.dumps(pins()))
    assert again.returncode == 0 and "run/s defined" in again.stdout, "the same pins again: idempotent"
    await acli("create", "run", "other", "--pins", str(tmp_path / "pins.yaml"), env=env)

    appended = await acli("append", "run", "s", '{"a": 1}', '"two"', "3", "--json", env=env)
    assert json.loads(appended.stdout) == {"sequences": [1, 2, 3], "replayed": False}
    text = await acli("append", "run", "s", "4", "--key", "k-4", env=env)
    assert text.stdout.strip() == "appended 1 record(s) to run/s: 4"
    replayed = await acli("append", "run", "s", "4", "--key", "k-4", "--json", env=env)
    assert json.loads(replayed.stdout) == {"sequences": [4], "replayed": True}

    got = await acli("get", "run", "s", "--json", env=env)
    assert json.loads(got.stdout)["state"]["last_sequence"] == 4
    described = await acli("get", "run", "s", env=env)
    assert "sequences  1..4" in described.stdout

    listed = await acli("ls", "run", "--json", env=env)
    assert [item["stream_id"] for item in json.loads(listed.stdout)] == ["other", "s"]
    table = await acli("ls", "run", env=env)
    assert table.stdout.splitlines()[0].split() == ["STREAM", "DIRECTION", "CONTENT", "CLASS", "LAST", "CLOSED"]

    ranged = await acli("read", "run", "s", "--after", "1", "--limit", "2", env=env)
    assert [json.loads(line)["data"] for line in ranged.stdout.splitlines()] == ["two", 3]
    last = await acli("read", "run", "s", "--last", "2", "--json", env=env)
    page = json.loads(last.stdout)
    assert [r["sequence"] for r in page["records"]] == [3, 4] and page["latest"] == 4

    tailed = await acli("tail", "run", "s", "--after", "2", "--count", "2", env=env)
    records = [json.loads(line) for line in tailed.stdout.splitlines()]
    assert [(r["sequence"], r["data"]) for r in records] == [(3, 3), (4, 4)]
    assert all(set(r) == {"sequence", "kind", "content_type", "size", "appended_at", "data"} for r in records), (
        "records print as HTTP shows them: no null data_base64/object"
    )

    acked = await acli("ack", "run", "s", "reader", "3", env=env)
    assert acked.stdout.strip() == "consumer reader on run/s acknowledged through 3"
    acked_json = await acli("ack", "run", "s", "reader", "4", "--json", env=env)
    assert json.loads(acked_json.stdout) == {"consumer_id": "reader", "acked_sequence": 4}

    closed = await acli("close", "run", "s", "--json", env=env)
    assert json.loads(closed.stdout)["closed"] is True
    one_line_error(await acli("append", "run", "s", "5", env=env), "409 stream_closed")


async def test_file_upload_and_deliveries(server: Replica, env: dict[str, str], tmp_path: Path) -> None:
    (tmp_path / "pins.json").write_text(json.dumps(pins()))
    await acli("create", "run", "files", "--pins", str(tmp_path / "pins.json"), env=env)
    blob = tmp_path / "blob.bin"
    blob.write_bytes(os.urandom(300_000))
    uploaded = await acli("append", "run", "files", "--file", str(blob), "--json", env=env)
    assert uploaded.returncode == 0, uploaded.stderr
    assert json.loads(uploaded.stdout) == {"sequences": [1]}
    read = await acli("read", "run", "files", "--json", env=env)
    (record,) = json.loads(read.stdout)["records"]
    assert record["kind"] == "object" and record["object"]["size"] == 300_000 and "data" not in record
    copy = tmp_path / "copy.bin"
    downloaded = await acli("download", "run", "files", "1", "-o", str(copy), "--json", env=env)
    assert downloaded.returncode == 0, downloaded.stderr
    assert copy.read_bytes() == blob.read_bytes()
    assert json.loads(downloaded.stdout)["sha256"] == record["object"]["sha256"]
    piped = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "workflow_streams", "download", "run", "files", "1"],
        capture_output=True,
        timeout=120,
        env={**os.environ, **env},
    )
    assert piped.returncode == 0 and piped.stdout == blob.read_bytes(), "to stdout when it is not a terminal"
    assert not await asyncio.to_thread(lambda: list(tmp_path.glob("*.part"))), "no partial file is left"
    other = tmp_path / "other.bin"
    other.write_bytes(os.urandom(400_000))
    status, _, terminal = await asyncio.to_thread(
        on_a_terminal, "append", "run", "files", "--file", str(other), env=env
    )
    assert status == 0 and "upload" in terminal and "100%" in terminal, "a progress bar on a terminal"
    status, _, terminal = await asyncio.to_thread(on_a_terminal, "tail", "run", "files", "--count", "1", env=env)
    assert status == 0 and "catch-up" in terminal, "a catch-up progress bar on a terminal"

    input_pins = pins(direction="input", content_class="user_input")
    (tmp_path / "input.json").write_text(json.dumps(input_pins))
    await acli("create", "run", "answers", "--pins", str(tmp_path / "input.json"), env=env)
    await acli("append", "run", "answers", '{"answer": "yes"}', env=env)
    deliveries = await acli("deliveries", "run", "answers", "--json", env=env)
    assert json.loads(deliveries.stdout)["counts"] == {"pending": 1, "delivered": 0, "failed": 0}, (
        "no wait service here: the record waits in the outbox"
    )
    assert "1 pending" in (await acli("deliveries", "run", "answers", env=env)).stdout
    requeued = await acli("requeue", "run", "answers", "--json", env=env)
    assert json.loads(requeued.stdout) == {"requeued": 0}


async def test_permanent_errors_are_one_line_at_once(server: Replica, env: dict[str, str], tmp_path: Path) -> None:
    await acli("create", "run", "e", "--pins", "-", env=env, stdin=json.dumps(pins()))
    one_line_error(await acli("append", "run", "e", "hello", env=env), "invalid_json")
    one_line_error(await acli("get", "run", "missing", env=env), "403 forbidden")
    one_line_error(await acli("get", "run", "e", env={**env, "WFS_TOKEN": "wrong"}), "401 unauthenticated")
    one_line_error(await acli("read", "run", "e", "--after", "9", env=env), "400 future_cursor")

    refused_port = free_port()  # nothing listens there
    # reported, not retried: without a terminal every retry prints a "retrying in" line on stderr, and
    # one_line_error allows exactly one line
    unreachable = await acli("tail", "run", "e", "--url", f"http://127.0.0.1:{refused_port}", env=env)
    one_line_error(unreachable, "unreachable")
    appended = await acli("append", "run", "e", "1", "--url", f"http://127.0.0.1:{refused_port}", env=env)
    one_line_error(appended, "unreachable")

    no_kubeconfig = {**env, "KUBECONFIG": str(tmp_path / "absent")}
    held = await acli("hold", "s", "--matter", "m", "--reason", "r", "--requested-by", "x", env=no_kubeconfig)
    assert held.returncode == 1 and len(held.stderr.splitlines()) == 1, held.stderr
    assert "Traceback" not in held.stderr


async def test_client_options_go_before_or_after_the_command(server: Replica, tmp_path: Path) -> None:
    (tmp_path / "pins.json").write_text(json.dumps(pins()))
    no_env = {"WFS_URL": "", "WFS_TOKEN": ""}
    created = await acli(
        "--url",
        server.base,
        "--token",
        "tok-alice",
        "create",
        "run",
        "o",
        "--pins",
        str(tmp_path / "pins.json"),
        env=no_env,
    )
    assert created.returncode == 0, created.stderr
    # the URL dev prints as the data plane, with the API's prefix
    printed = f"{server.base}/api/workflow-streams"
    after = await acli("ls", "run", "--url", printed, "--token", "tok-alice", "--json", env=no_env)
    assert after.returncode == 0, after.stderr
    assert [item["stream_id"] for item in json.loads(after.stdout)] == ["o"]
    before = await acli("--json", "--url", printed + "/", "--token", "tok-alice", "get", "run", "o", env=no_env)
    assert before.returncode == 0 and json.loads(before.stdout)["stream_id"] == "o", before.stderr
    mixed = await acli("--url", server.base, "append", "run", "o", "1", "--token", "tok-alice", "--json", env=no_env)
    assert json.loads(mixed.stdout)["sequences"] == [1], mixed.stderr


async def test_transient_failures_are_retried_visibly(server: Replica, env: dict[str, str]) -> None:
    tight = pins(credit={"max_unread_items": 1, "max_unread_bytes": 10_000, "policy": "reject"})
    await acli("create", "run", "tight", "--pins", "-", env=env, stdin=json.dumps(tight))
    await acli("append", "run", "tight", "1", env=env)
    result = await acli("append", "run", "tight", "2", "--max-wait", "2.5", env=env)
    assert result.returncode == 1
    *retries, last = result.stderr.splitlines()
    assert retries and all("429 backpressure; retrying in" in line for line in retries), result.stderr
    assert last.startswith("error: 429 backpressure"), last
    status, _, terminal = await asyncio.to_thread(
        on_a_terminal, "append", "run", "tight", "2", "--max-wait", "1.5", env=env
    )
    assert status == 1 and "retrying in 1s (Ctrl-C stops)" in terminal, terminal


async def test_an_object_store_missing_is_permanent(database_url: str, tmp_path: Path) -> None:
    plain = Replica(database_url, tmp_path / "plain.log", WFS_REGION="eu-west-1")  # no WFS_S3_REGIONS
    try:
        async with aiohttp.ClientSession() as session:
            await plain.ready(session)
        env = {"WFS_URL": plain.base, "WFS_TOKEN": "tok-alice"}
        await acli("create", "run", "o", "--pins", "-", env=env, stdin=json.dumps(pins()))
        blob = tmp_path / "blob.bin"
        blob.write_bytes(b"x" * 100_000)
        result = await acli("append", "run", "o", "--file", str(blob), env=env)
        # not retried (the store will not appear): a retry would print a "retrying in" line on stderr
        one_line_error(result, "421 object_region_unavailable")
    finally:
        plain.stop()


def test_help_and_completion() -> None:
    serve = cli("serve", "--help")
    assert serve.returncode == 0
    for setting in ("WFS_DATABASE_URL", "WFS_TOKENS", "WFS_S3_REGIONS", "WFS_WAIT_SERVICE_URL"):
        assert setting in serve.stdout
    assert "WFS_DATABASE_URL                 Postgres DSN (required)" in serve.stdout
    dev = " ".join(cli("dev", "--help").stdout.split())
    assert "WFS_DATABASE_URL Postgres DSN (default: a throwaway cluster" in dev, "dev needs no database"
    assert "required" not in dev
    tail_help = " ".join(cli("tail", "--help").stdout.split())
    assert "--after AFTER start after this sequence" in tail_help and "--quiet no progress bar" in tail_help
    append_help = " ".join(cli("append", "--help").stdout.split())
    assert "--content-type CONTENT_TYPE the uploaded file's content type" in append_help
    tail = cli("tail", "--help", env={"WFS_URL": "http://example.test:9"})
    assert "default: http://example.test:9" in " ".join(tail.stdout.split())
    top = cli("--help")
    assert "whole product" in top.stdout and "deliveries" in top.stdout
    for shell in ("bash", "zsh"):
        script = cli("completion", shell)
        assert script.returncode == 0 and "workflow-streams" in script.stdout, script.stderr


def test_every_command_and_option_is_described() -> None:
    parser = build_parser()
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    assert set(commands.choices) >= {"dev", "serve", "migrate", "operator", "create", "tail", "download", "hold"}
    for name, command in commands.choices.items():
        assert command.description, f"{name} has no description"
        for action in command._actions:
            assert action.help, f"{name} {'/'.join(action.option_strings) or action.dest} has no help"


def test_completion_completes_commands(tmp_path: Path) -> None:
    """argcomplete's protocol, as the bash script drives it: the line so far in, candidates out."""
    line = "workflow-streams de"
    out = tmp_path / "candidates"
    result = subprocess.run(
        [sys.executable, "-m", "workflow_streams"],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
        env={
            **os.environ,
            "_ARGCOMPLETE": "1",
            "COMP_LINE": line,
            "COMP_POINT": str(len(line)),
            "_ARGCOMPLETE_IFS": "\n",
            "_ARGCOMPLETE_STDOUT_FILENAME": str(out),
        },
    )
    assert result.returncode == 0, result.stderr
    assert set(out.read_text().split()) == {"delete", "deliveries", "dev"}


async def test_a_first_stream_in_one_command_and_errors_that_help(
    server: Replica, env: dict[str, str], tmp_path: Path
) -> None:
    created = await acli("create", "run-first", "answers", env=env)
    assert created.returncode == 0, created.stderr
    assert "run-first/answers defined from the default" in created.stdout
    stored = json.loads((await acli("get", "run-first", "answers", "--json", env=env)).stdout)["pins"]
    assert stored["authorization"]["append"] == ["alice"] and stored["placement"]["object_regions"] == ["eu-west-1"]
    assert (await acli("append", "run-first", "answers", '"hi"', env=env)).returncode == 0
    assert (await acli("ack", "run-first", "answers", "reader", "1", env=env)).returncode == 0
    described = (await acli("get", "run-first", "answers", env=env)).stdout
    assert "unread     0 of 10000 records" in described, described
    assert "consumers  reader at 1 (lag 0)" in described, described
    runs = await acli("ls", env=env)
    assert runs.returncode == 0 and runs.stdout.splitlines()[0].split() == ["RUN", "STREAMS", "LATEST", "CREATED"]
    assert "run-first" in runs.stdout
    deleted = await acli("delete", "run-first", "answers", env=env)
    assert deleted.returncode == 0 and "deleted" in deleted.stdout, deleted.stderr
    assert "run-first" not in (await acli("ls", env=env)).stdout

    # the server's field errors reach the user: a typo in the pins
    typo = pins()
    typo["credit"]["polcy"] = "block"
    (tmp_path / "typo.json").write_text(json.dumps(typo))
    refused = await acli("create", "run-first", "typo", "--pins", str(tmp_path / "typo.json"), env=env)
    one_line_error(refused, "422 invalid_definition")
    assert "credit/polcy: Extra inputs are not permitted" in refused.stderr
    # pins no region here can serve: the field is named
    far = pins(placement={"object_regions": ["us-east-1"]})
    (tmp_path / "far.yaml").write_text(yaml.safe_dump(far))
    refused = await acli("create", "run-first", "far", "--pins", str(tmp_path / "far.yaml"), env=env)
    one_line_error(refused, "422 invalid_definition")
    assert "placement/object_regions" in refused.stderr
    # a JSON file is read as JSON: a trailing comma is a JSON error with its line and column
    (tmp_path / "comma.json").write_text('{\n  "direction": "output",\n}\n')
    refused = await acli("create", "run-first", "comma", "--pins", str(tmp_path / "comma.json"), env=env)
    one_line_error(refused, "invalid_pins_file")
    assert "line 3, column 1" in refused.stderr
