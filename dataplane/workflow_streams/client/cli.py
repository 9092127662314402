"""CLI subcommands on the client: create, get, ls, read, tail, append, ack, close, deliveries, requeue,
hold, release, completion.

Every command prints text for people, or with ``--json`` one JSON document (``tail``/``read``: one
record per line). Failures are one line on stderr, ``error: <status> <code>: <detail>``, and exit
status 1: a permanent refusal at once, a transient one (backpressure, an unavailable server) after
retrying with a visible countdown.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from tqdm import tqdm

from .client import StreamsClient
from .errors import ProblemError
from .kube import HoldPending, KubeClient
from .models import Page, Record

DEFAULT_URL = "http://127.0.0.1:8080"


class UsageError(Exception):
    """A bad argument, found before anything is sent: ``code`` names it like a server problem."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def add_commands(sub: Any) -> None:
    def client_args(parser: argparse.ArgumentParser, stream: bool = True) -> None:
        parser.add_argument(
            "--url",
            default=os.environ.get("WFS_URL", DEFAULT_URL),
            help=f"the data plane (default: %(default)s; from $WFS_URL, else {DEFAULT_URL})",
        )
        parser.add_argument("--token", default=os.environ.get("WFS_TOKEN", ""), help="default: $WFS_TOKEN")
        parser.add_argument("--json", action="store_true", help="print JSON instead of text")
        parser.add_argument("run_id")
        if stream:
            parser.add_argument("stream_id")

    def command(name: str, func: Callable[[argparse.Namespace], Coroutine[Any, Any, None]], **kw: Any) -> Any:
        parser = sub.add_parser(name, **kw)
        parser.set_defaults(func=lambda a: _run(func, a))
        return parser

    create = command("create", _create, help="define a stream from a pins file (idempotent for the same pins)")
    client_args(create)
    create.add_argument("--pins", required=True, type=Path, help="JSON or YAML pins, or '-' for stdin")

    get = command("get", _get, help="a stream's definition and state")
    client_args(get)

    ls = command("ls", _ls, help="a run's streams")
    client_args(ls, stream=False)

    read = command("read", _read, help="one range of records as JSON lines (no following)")
    client_args(read)
    where = read.add_mutually_exclusive_group()
    where.add_argument("--after", type=int, default=0, help="records after this sequence (default 0)")
    where.add_argument("--last", type=int, metavar="N", help="the last N records")
    read.add_argument("--limit", type=int, default=100, help="at most this many records (1-1000, default 100)")

    tail = command("tail", _tail, help="print records as JSON lines: catch up, then follow")
    client_args(tail)
    tail.add_argument("--after", type=int, default=0)
    tail.add_argument("--count", type=int, help="exit after this many records")
    tail.add_argument("--quiet", action="store_true", help="no progress bar")

    append = command("append", _append, help="append JSON values, or upload a file as an object record")
    client_args(append)
    append.add_argument("data", nargs="*", help="JSON values, one record each (a string is '\"quoted\"')")
    append.add_argument("--file", type=Path, help="upload this file (objects API) instead")
    append.add_argument("--content-type", default="application/octet-stream")
    append.add_argument("--key", help="idempotency key")
    append.add_argument("--quiet", action="store_true")
    append.add_argument("--max-wait", type=float, default=60.0, help="retry backpressure this long (default 60 s)")

    ack = command("ack", _ack, help="acknowledge through a sequence")
    client_args(ack)
    ack.add_argument("consumer_id")
    ack.add_argument("sequence", type=int)

    close = command("close", _close, help="close a stream: no more appends, reads still work")
    client_args(close)

    deliveries = command("deliveries", _deliveries, help="an input stream's deliveries to the wait service")
    client_args(deliveries)

    requeue = command("requeue", _requeue, help="retry an input stream's failed deliveries")
    client_args(requeue)

    hold = sub.add_parser("hold", help="place a legal hold: creates a StreamLegalHold (Kubernetes API)")
    hold.add_argument("stream", help="the WorkflowStream's name")
    hold.add_argument("--namespace", "-n")
    hold.add_argument("--matter", required=True)
    hold.add_argument("--reason", required=True)
    hold.add_argument("--requested-by", required=True)
    hold.add_argument("--name", help="the hold's name (default: <stream>-<matter>)")
    _wait_args(hold, "until the operator reports the hold applied")
    hold.set_defaults(func=lambda a: _run(_hold, a))

    release = sub.add_parser("release", help="release a legal hold: deletes the StreamLegalHold")
    release.add_argument("name")
    release.add_argument("--namespace", "-n")
    _wait_args(release, "until the operator has released the hold and the object is gone")
    release.set_defaults(func=lambda a: _run(_release, a))

    completion = sub.add_parser(
        "completion",
        help="print a shell completion script",
        description='bash: eval "$(workflow-streams completion bash)"; zsh: the same in ~/.zshrc',
    )
    completion.add_argument("shell", choices=["bash", "zsh"])
    completion.set_defaults(func=_completion)


def _run(command: Callable[[argparse.Namespace], Coroutine[Any, Any, None]], args: argparse.Namespace) -> int:
    """Run a client command; every failure becomes one line on stderr and exit status 1."""
    try:
        asyncio.run(command(args))
    except KeyboardInterrupt:
        return 130
    except ProblemError as exc:
        return _fail(str(exc))
    except UsageError as exc:
        return _fail(f"{exc.code}: {exc}")
    except aiohttp.ClientConnectorError as exc:
        return _fail(f"unreachable: cannot connect to {getattr(args, 'url', '?')}: {exc.os_error or exc}")
    except (aiohttp.ClientError, TimeoutError) as exc:
        return _fail(f"unreachable: {getattr(args, 'url', '?')}: {exc or type(exc).__name__}")
    except PermissionError as exc:  # a refusal by the Kubernetes API server
        return _fail(f"forbidden: {exc}")
    except HoldPending as exc:  # hold/release: requested, but the operator has not reported it done
        return _fail(f"pending: {exc}")
    except FileNotFoundError as exc:
        return _fail(f"not_found: {exc.strerror}: {exc.filename}")
    except OSError as exc:
        return _fail(f"os_error: {exc}")
    return 0


def _fail(message: str) -> int:
    print(f"error: {' '.join(message.split())}", file=sys.stderr, flush=True)
    return 1


def _client(args: argparse.Namespace, max_wait: float = 60.0) -> StreamsClient:
    # connect_wait=0: nothing listening at --url is reported at once, not after a minute of retries
    return StreamsClient(args.url, args.token, max_wait=max_wait, connect_wait=0, retry_wait=_countdown)


async def _countdown(seconds: float, reason: str) -> None:
    """Wait before a retry where the user can see it: a ticking countdown on a terminal, one line otherwise."""
    if not sys.stderr.isatty():
        print(f"{reason}; retrying in {seconds:.1f}s", file=sys.stderr, flush=True)
        await asyncio.sleep(seconds)
        return
    remaining = seconds
    while remaining > 0:
        print(f"\r\033[K{reason}; retrying in {math.ceil(remaining)}s (Ctrl-C stops)", end="", file=sys.stderr)
        step = min(1.0, remaining)
        await asyncio.sleep(step)
        remaining -= step
    print("\r\033[K", end="", file=sys.stderr, flush=True)


def _emit(args: argparse.Namespace, body: Any, text: str) -> None:
    print(json.dumps(body) if args.json else text, flush=True)


def _print(record: Record) -> None:
    print(json.dumps(record.to_json()), flush=True)


def _progress_disabled(args: argparse.Namespace) -> bool | None:
    return True if args.quiet else None  # None: tqdm draws only on a terminal


def _load_pins(path: Path) -> dict[str, Any]:
    text = sys.stdin.read() if str(path) == "-" else path.read_text()
    try:
        pins = yaml.safe_load(text)  # YAML is a superset of JSON
    except yaml.YAMLError as exc:
        raise UsageError("invalid_pins_file", f"{path} is neither JSON nor YAML: {exc}") from None
    if isinstance(pins, dict) and isinstance(pins.get("pins"), dict):
        pins = pins["pins"]  # a whole create body is fine too
    if not isinstance(pins, dict):
        raise UsageError("invalid_pins_file", f"{path} must hold a JSON/YAML object of pins")
    return pins


async def _create(args: argparse.Namespace) -> None:
    pins = _load_pins(args.pins)
    async with _client(args) as client:
        body = await client.create_stream(args.run_id, args.stream_id, pins)
    _emit(args, body, f"{args.run_id}/{args.stream_id} defined (pins digest {body.get('pins_digest', '?')})")


async def _get(args: argparse.Namespace) -> None:
    async with _client(args) as client:
        body = await client.get_stream(args.run_id, args.stream_id)
    _emit(args, body, _describe(body))


def _describe(body: dict[str, Any]) -> str:
    pins, state = body.get("pins", {}), body.get("state", {})
    holds = ", ".join(h.get("hold_id", "?") for h in state.get("legal_holds", [])) or "none"
    return "\n".join(
        [
            f"{body['run_id']}/{body['stream_id']}: {pins.get('direction')} {pins.get('content_class')}"
            f" ({pins.get('schema_ref')})",
            f"  sequences  {state.get('earliest_sequence')}..{state.get('last_sequence')}",
            f"  closed     {'yes, by ' + str(state.get('closed_by')) if state.get('closed') else 'no'}",
            f"  holds      {holds}",
            f"  created    {body.get('created_at')} by {body.get('created_by')}",
            f"  pins       {body.get('pins_digest')}",
        ]
    )


async def _ls(args: argparse.Namespace) -> None:
    async with _client(args) as client:
        streams = await client.list_streams(args.run_id)
    if args.json:
        print(json.dumps(streams), flush=True)
        return
    if not streams:
        print(f"no streams in run {args.run_id} that you may see", flush=True)
        return
    rows = [("STREAM", "DIRECTION", "CONTENT CLASS", "LAST", "CLOSED")]
    for item in streams:
        pins, state = item.get("pins", {}), item.get("state", {})
        closed = "yes" if state.get("closed") else "no" if state else "?"
        last = str(state.get("last_sequence", "?"))
        rows.append((item["stream_id"], pins.get("direction", "?"), pins.get("content_class", "?"), last, closed))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip(), flush=True)


async def _read(args: argparse.Namespace) -> None:
    if not 1 <= args.limit <= 1000:
        raise UsageError("invalid_argument", "--limit must be 1-1000")
    async with _client(args) as client:
        if args.last is not None:
            if args.last < 1:
                raise UsageError("invalid_argument", "--last must be at least 1")
            page = await client.read_last(args.run_id, args.stream_id, min(args.last, args.limit))
        else:
            page = await client.read(args.run_id, args.stream_id, args.after, args.limit)
    if args.json:
        body = {
            "records": [r.to_json() for r in page.records],
            "next_after": page.next_after,
            "earliest": page.earliest,
            "latest": page.latest,
            "closed": page.closed,
        }
        print(json.dumps(body), flush=True)
        return
    for record in page.records:
        _print(record)


async def _tail(args: argparse.Namespace) -> None:
    seen = 0
    async with _client(args) as client:
        first = await client.read(args.run_id, args.stream_id, args.after, limit=1)
        bar = tqdm(
            total=max(first.latest - args.after, 0),
            unit="rec",
            desc="catch-up",
            disable=_progress_disabled(args),
            file=sys.stderr,
        )

        def advance(page: Page) -> None:
            bar.update(len(page.records))

        last = args.after
        async for record in client.iter_records(args.run_id, args.stream_id, args.after, advance):
            _print(record)
            last, seen = record.sequence, seen + 1
            if args.count and seen >= args.count:
                return
        bar.close()
        async for record in client.subscribe(args.run_id, args.stream_id, last):
            _print(record)
            seen += 1
            if args.count and seen >= args.count:
                return


def _json_values(texts: list[str]) -> list[Any]:
    values = []
    for position, text in enumerate(texts, start=1):
        try:
            values.append(json.loads(text))
        except json.JSONDecodeError:
            hint = f"; a string is quoted: '{json.dumps(text)}'" if text.strip() else ""
            raise UsageError("invalid_json", f"argument {position} ({text!r}) is not a JSON value{hint}") from None
    return values


async def _append(args: argparse.Namespace) -> None:
    if args.file:
        if args.data:
            raise UsageError("invalid_argument", "give JSON values or --file, not both")
        size = args.file.stat().st_size
        async with _client(args, args.max_wait) as client:
            with tqdm(
                total=size, unit="B", unit_scale=True, desc="upload", disable=_progress_disabled(args), file=sys.stderr
            ) as bar:

                def sent(total: int) -> None:
                    bar.update(total - bar.n)

                sequence = await client.upload_object(
                    args.run_id,
                    args.stream_id,
                    args.file,
                    idempotency_key=args.key,
                    content_type=args.content_type,
                    progress=sent,
                )
        where = f"{args.run_id}/{args.stream_id}"
        _emit(args, {"sequences": [sequence]}, f"uploaded {args.file.name} ({size} bytes) to {where} as {sequence}")
        return
    if not args.data:
        raise UsageError("invalid_argument", "nothing to append: give JSON values or --file")
    values = _json_values(args.data)
    async with _client(args, args.max_wait) as client:
        result = await client.append(args.run_id, args.stream_id, *values, idempotency_key=args.key)
    sequences = result.sequences
    span = str(sequences[0]) if len(sequences) == 1 else f"{sequences[0]}-{sequences[-1]}"
    replayed = " (a replay: already appended with this key)" if result.replayed else ""
    text = f"appended {len(sequences)} record(s) to {args.run_id}/{args.stream_id}: {span}{replayed}"
    _emit(args, {"sequences": sequences, "replayed": result.replayed}, text)


async def _ack(args: argparse.Namespace) -> None:
    async with _client(args) as client:
        body = await client.ack(args.run_id, args.stream_id, args.consumer_id, args.sequence)
    acked = body.get("acked_sequence", args.sequence)
    text = f"consumer {args.consumer_id} on {args.run_id}/{args.stream_id} acknowledged through {acked}"
    _emit(args, body, text)


async def _close(args: argparse.Namespace) -> None:
    async with _client(args) as client:
        state = await client.close(args.run_id, args.stream_id)
    _emit(args, state, f"{args.run_id}/{args.stream_id} closed at sequence {state.get('last_sequence')}")


async def _deliveries(args: argparse.Namespace) -> None:
    async with _client(args) as client:
        body = await client.deliveries(args.run_id, args.stream_id)
    counts = body.get("counts", {})
    lines = [f"{args.run_id}/{args.stream_id}: " + ", ".join(f"{n} {state}" for state, n in counts.items())]
    for row in body.get("failed", []):
        lines.append(f"  failed {row['sequence']} after {row['attempts']} attempt(s): {row.get('last_error')}")
    due = body.get("next")
    if due:
        lines.append(f"  next    {due['sequence']} at {due['next_attempt_at']} (attempt {due['attempts'] + 1})")
    _emit(args, body, "\n".join(lines))


async def _requeue(args: argparse.Namespace) -> None:
    async with _client(args) as client:
        count = await client.requeue(args.run_id, args.stream_id)
    _emit(args, {"requeued": count}, f"requeued {count} failed deliveries of {args.run_id}/{args.stream_id}")


def _completion(args: argparse.Namespace) -> int:
    try:
        import argcomplete
    except ImportError:
        return _fail("missing_dependency: shell completion needs argcomplete (pip install argcomplete)")
    print(argcomplete.shellcode(["workflow-streams"], shell=args.shell), end="")  # type: ignore[attr-defined]
    return 0


def _wait_args(parser: argparse.ArgumentParser, until: str) -> None:
    parser.add_argument("--timeout", type=float, default=60.0, help=f"seconds to wait {until} (default: 60)")
    parser.add_argument("--no-wait", action="store_true", help="only send the request; do not wait " + until)


async def _hold(args: argparse.Namespace) -> None:
    kube = KubeClient()
    namespace = args.namespace or kube.namespace
    name = args.name or f"{args.stream}-{args.matter}".lower()
    await kube.create_hold(namespace, name, args.stream, args.matter, args.reason, args.requested_by)
    if args.no_wait:
        print(
            f"streamlegalhold.workflowstreams.dev/{name} created: the hold is only requested; the operator applies "
            f"it, and the stream is held once its Applied condition is True (kubectl get wfhold {name} -n {namespace})"
        )
        return
    applied = await kube.wait_hold_applied(namespace, name, args.timeout)
    print(f"streamlegalhold.workflowstreams.dev/{name} applied: {applied.get('message', 'the stream is held')}")


async def _release(args: argparse.Namespace) -> None:
    kube = KubeClient()
    namespace = args.namespace or kube.namespace
    await kube.delete_hold(namespace, args.name)
    if args.no_wait:
        print(
            f"streamlegalhold.workflowstreams.dev/{args.name} deletion requested: the stream stays held until the "
            f"operator has released it and the object is gone (kubectl get wfhold {args.name} -n {namespace})"
        )
        return
    await kube.wait_hold_gone(namespace, args.name, args.timeout)
    print(f"streamlegalhold.workflowstreams.dev/{args.name} released")
