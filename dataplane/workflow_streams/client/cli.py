"""CLI subcommands on the client: create, get, ls, delete, templates, read, tail, append, ack, close,
deliveries, requeue, hold, release, completion.

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
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from tqdm import tqdm

from .client import CATCH_UP_RECORDS, PREFIX, StreamsClient
from .errors import ProblemError
from .kube import HoldPending, KubeClient
from .models import Page, Record

DEFAULT_URL = "http://127.0.0.1:8080"


class UsageError(Exception):
    """A bad argument, found before anything is sent: ``code`` names it like a server problem."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


CLIENT_OPTIONS = ("url", "token", "json")


def add_global_options(parser: argparse.ArgumentParser) -> None:
    """The client options, accepted before the command (``workflow-streams --url X ls run-1``) and after it
    (``workflow-streams ls run-1 --url X``). Unset, they are left out of the namespace (``SUPPRESS``) so
    that one place does not overwrite the other; ``_resolve`` fills in the defaults."""
    group = parser.add_argument_group("client options (before or after the command)")
    group.add_argument(
        "--url",
        default=argparse.SUPPRESS,
        help=f"the data plane, with or without {PREFIX} (default: {os.environ.get('WFS_URL') or DEFAULT_URL};"
        f" from $WFS_URL, else {DEFAULT_URL})",
    )
    group.add_argument("--token", default=argparse.SUPPRESS, help="the bearer token (default: $WFS_TOKEN)")
    group.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print JSON instead of text")


def _resolve(args: argparse.Namespace) -> argparse.Namespace:
    if not getattr(args, "url", None):
        args.url = os.environ.get("WFS_URL") or DEFAULT_URL
    if getattr(args, "token", None) is None:
        args.token = os.environ.get("WFS_TOKEN", "")
    args.json = bool(getattr(args, "json", False))
    return args


def add_commands(sub: Any) -> None:
    def client_args(parser: argparse.ArgumentParser, stream: bool = True) -> None:
        add_global_options(parser)
        parser.add_argument("run_id", help="the run")
        if stream:
            parser.add_argument("stream_id", help="the stream, in the run")

    def command(
        name: str, func: Callable[[argparse.Namespace], Coroutine[Any, Any, None]], help: str, description: str
    ) -> Any:
        parser = sub.add_parser(
            name, help=help, description=description, formatter_class=argparse.RawDescriptionHelpFormatter
        )
        parser.set_defaults(func=lambda a: _run(func, _resolve(a)))
        return parser

    create = command(
        "create",
        _create,
        "define a stream (from the default template, a named one, or a pins file)",
        "Define a stream: POST /runs/{run}/streams. Without options the server's default template makes it\n"
        "(its regions, every right for you); --template names another (`workflow-streams templates`), and\n"
        "--pins either gives the whole pins or, with --template, the pins to change in it. The stored pins\n"
        "are the whole resolved document and immutable: the same pins again answer the existing definition,\n"
        "other pins are 409 pins_conflict naming the fields that differ.\n\n"
        "  workflow-streams create run-1 answers\n"
        "  workflow-streams create run-1 audit --template audited\n"
        "  workflow-streams create run-1 input --pins pins.yaml",
    )
    client_args(create)
    create.add_argument(
        "--pins", type=Path, help="a pins file: .json is read as JSON, anything else as YAML; '-' for stdin (YAML)"
    )
    create.add_argument("--template", help="a pins template of the server's (default: its default template)")

    get = command(
        "get",
        _get,
        "a stream's definition and state: unread, consumers, holds, deliveries",
        "A stream's definition (pins, digest, creator, owner) and what Postgres holds for it: unread records\n"
        "and bytes against the credit ceilings (why a producer is blocked), each consumer's ack and lag,\n"
        "legal holds, input deliveries by state and objects being uploaded.",
    )
    client_args(get)

    ls = command(
        "ls",
        _ls,
        "the runs you may see, or a run's streams",
        "Without a run: the runs in which this token may see a stream, with how many. With one: the run's\n"
        "streams this token may see, in stream id order (all pages), with direction, content class,\n"
        "latest sequence and whether each is closed.",
    )
    add_global_options(ls)
    ls.add_argument("run_id", nargs="?", help="the run (default: list the runs)")

    delete = command(
        "delete",
        _delete,
        "delete a stream and its records",
        "Delete a stream: its records go, its objects are queued for deletion from S3, and its name can be\n"
        "defined again. Needs the stream's delete right; refused (409 stream_held) while a legal hold exists,\n"
        "and (409 owned_elsewhere) for a stream a WorkflowStream owns: delete that object instead.",
    )
    client_args(delete)

    templates = command(
        "templates",
        _templates,
        "the server's pins templates",
        "The pins templates `create --template` may name, with what each sets.",
    )
    add_global_options(templates)

    read = command(
        "read",
        _read,
        "one range of records as JSON lines (no following)",
        "One range of records, one JSON object per line as the HTTP API shows them (with --json: the page).",
    )
    client_args(read)
    where = read.add_mutually_exclusive_group()
    where.add_argument("--after", type=int, default=0, help="records after this sequence (default 0)")
    where.add_argument("--last", type=int, metavar="N", help="the last N records")
    read.add_argument(
        "--limit", type=int, default=100, help="at most this many records (1-100000, default 100; about 1 MiB of them)"
    )

    tail = command(
        "tail",
        _tail,
        "print records as JSON lines: catch up, then follow",
        "Print every record after --after as a JSON line (a progress bar on a terminal while catching up),\n"
        "then follow the stream (Server-Sent Events, resumed after drops) until it is closed or --count.",
    )
    client_args(tail)
    tail.add_argument("--after", type=int, default=0, help="start after this sequence (default 0: from the start)")
    tail.add_argument("--count", type=int, help="exit after this many records")
    tail.add_argument("--quiet", action="store_true", help="no progress bar")

    append = command(
        "append",
        _append,
        "append JSON values, or upload a file as an object record",
        "Append JSON values, one record each, all or nothing; or upload a file (--file) through the objects\n"
        "API (prepare, upload with a progress bar, commit) as one object record. Backpressure is retried.",
    )
    client_args(append)
    append.add_argument("data", nargs="*", help="JSON values, one record each (a string is '\"quoted\"')")
    append.add_argument("--file", type=Path, help="upload this file (objects API) instead")
    append.add_argument(
        "--content-type",
        default="application/octet-stream",
        help="the uploaded file's content type (--file; default application/octet-stream)",
    )
    append.add_argument("--key", help="idempotency key (default: one per request; --file: from name and digest)")
    append.add_argument("--quiet", action="store_true", help="no progress bar (--file)")
    append.add_argument("--max-wait", type=float, default=60.0, help="retry backpressure this long (default 60 s)")

    download = command(
        "download",
        _download,
        "write an object record's bytes to a file or stdout",
        "Download the bytes of the object record at SEQUENCE (read right and client egress as for reads),\n"
        "checked against the record's sha256. A progress bar on a terminal.",
    )
    client_args(download)
    download.add_argument("sequence", type=int, help="the object record's sequence")
    download.add_argument(
        "--output", "-o", help="write here ('-': stdout; default: stdout unless it is a terminal)", metavar="FILE"
    )
    download.add_argument("--quiet", action="store_true", help="no progress bar")

    ack = command(
        "ack",
        _ack,
        "acknowledge through a sequence",
        "Acknowledge every record through SEQUENCE for CONSUMER_ID; acks only advance and return credit.",
    )
    client_args(ack)
    ack.add_argument("consumer_id", help="the consumer; it belongs to the first stream it acknowledged")
    ack.add_argument("sequence", type=int, help="the last sequence read")

    close = command(
        "close",
        _close,
        "close a stream: no more appends, reads still work",
        "Close a stream: appends are refused (409 stream_closed), reads and subscriptions drain it.",
    )
    client_args(close)

    deliveries = command(
        "deliveries",
        _deliveries,
        "an input stream's deliveries to the wait service",
        "An input stream's delivery to the wait service: counts by state, failed rows, the next due.",
    )
    client_args(deliveries)

    requeue = command(
        "requeue",
        _requeue,
        "retry an input stream's failed deliveries",
        "Retry an input stream's failed deliveries, in order (once the wait service is fixed).",
    )
    client_args(requeue)

    hold = sub.add_parser(
        "hold",
        help="place a legal hold: creates a StreamLegalHold (Kubernetes API)",
        description="Place a legal hold on a WorkflowStream: creates a StreamLegalHold through the Kubernetes\n"
        "API (KUBECONFIG) and waits until the operator reports it applied (its Applied condition).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    hold.add_argument("stream", help="the WorkflowStream's name")
    hold.add_argument("--namespace", "-n", help="the WorkflowStream's namespace (default: the kubeconfig's)")
    hold.add_argument("--matter", required=True, help="the legal matter's id")
    hold.add_argument("--reason", required=True, help="why the stream is held")
    hold.add_argument("--requested-by", required=True, help="who asked for the hold")
    hold.add_argument("--name", help="the hold's name (default: <stream>-<matter>)")
    _wait_args(hold, "until the operator reports the hold applied")
    hold.set_defaults(func=lambda a: _run(_hold, a))

    release = sub.add_parser(
        "release",
        help="release a legal hold: deletes the StreamLegalHold",
        description="Release a legal hold: deletes the StreamLegalHold and waits until the operator has\n"
        "released the hold and the object is gone.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    release.add_argument("name", help="the StreamLegalHold's name")
    release.add_argument("--namespace", "-n", help="its namespace (default: the kubeconfig's)")
    _wait_args(release, "until the operator has released the hold and the object is gone")
    release.set_defaults(func=lambda a: _run(_release, a))

    completion = sub.add_parser(
        "completion",
        help="print a shell completion script",
        description='Print a shell completion script. bash: eval "$(workflow-streams completion bash)"; zsh: the\n'
        "same in ~/.zshrc.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    completion.add_argument("shell", choices=["bash", "zsh"], help="the shell")
    completion.set_defaults(func=_completion)


def _run(command: Callable[[argparse.Namespace], Coroutine[Any, Any, None]], args: argparse.Namespace) -> int:
    """Run a client command; every failure becomes one line on stderr and exit status 1."""
    try:
        asyncio.run(command(args))
    except KeyboardInterrupt:
        return _fail("interrupted: stopped by Ctrl-C", status=130)
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
    except LookupError as exc:  # the Kubernetes API server has no such object
        return _fail(f"not_found: {exc}")
    except HoldPending as exc:  # hold/release: requested, but the operator has not reported it done
        return _fail(f"pending: {exc}")
    except FileNotFoundError as exc:
        return _fail(f"not_found: {exc.strerror}: {exc.filename}")
    except OSError as exc:
        return _fail(f"os_error: {exc}")
    return 0


def _fail(message: str, status: int = 1) -> int:
    print(f"error: {' '.join(message.split())}", file=sys.stderr, flush=True)
    return status


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
    """A pins file by its extension: ``.json`` as JSON (an error says its line and column), anything
    else and stdin as YAML."""
    raw = sys.stdin.buffer.read() if str(path) == "-" else path.read_bytes()
    try:
        text = raw.decode()
    except UnicodeDecodeError:
        raise UsageError("invalid_pins_file", f"{path} is not a text file of JSON or YAML pins") from None
    if path.suffix.lower() == ".json":
        try:
            pins = json.loads(text)
        except json.JSONDecodeError as exc:
            raise UsageError(
                "invalid_pins_file", f"{path}: not valid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}"
            ) from None
    else:
        try:
            pins = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise UsageError("invalid_pins_file", f"{path} is not valid YAML: {' '.join(str(exc).split())}") from None
    if isinstance(pins, dict) and isinstance(pins.get("pins"), dict):
        pins = pins["pins"]  # a whole create body is fine too
    if not isinstance(pins, dict):
        raise UsageError("invalid_pins_file", f"{path} must hold a JSON/YAML object of pins")
    return pins


async def _create(args: argparse.Namespace) -> None:
    pins = _load_pins(args.pins) if args.pins is not None else None
    async with _client(args) as client:
        body = await client.create_stream(args.run_id, args.stream_id, pins, args.template)
    how = f"from template {args.template}" if args.template else "from the pins file" if pins else "from the default"
    _emit(args, body, f"{args.run_id}/{args.stream_id} defined {how} (pins digest {body.get('pins_digest', '?')})")


async def _delete(args: argparse.Namespace) -> None:
    async with _client(args) as client:
        body = await client.delete_stream(args.run_id, args.stream_id)
    queued = body.get("objects_queued", 0)
    _emit(args, body, f"{args.run_id}/{args.stream_id} deleted; {queued} object(s) queued for deletion")


async def _templates(args: argparse.Namespace) -> None:
    async with _client(args) as client:
        templates = await client.list_templates()
    lines = []
    for template in templates:
        where = ", ".join(template["namespaces"]) if template.get("namespaces") else "every namespace"
        lines.append(f"{template['name']}: {template.get('description') or '(no description)'} [{where}]")
        for key, value in sorted(template.get("pins", {}).items()):
            lines.append(f"  {key}: {json.dumps(value)}")
    _emit(args, templates, "\n".join(lines))


async def _get(args: argparse.Namespace) -> None:
    async with _client(args) as client:
        body = await client.get_stream(args.run_id, args.stream_id)
    _emit(args, body, _describe(body))


def _describe(body: dict[str, Any]) -> str:
    pins, state = body.get("pins", {}), body.get("state", {})
    holds = ", ".join(f"{h.get('hold_id', '?')} ({h.get('reason')})" for h in state.get("legal_holds", [])) or "none"
    owner = state.get("owner")
    lines = [
        f"{body['run_id']}/{body['stream_id']}: {pins.get('direction')} {pins.get('content_class')}"
        f" ({pins.get('schema_ref')})",
        f"  sequences  {state.get('earliest_sequence')}..{state.get('last_sequence')}",
    ]
    unread = state.get("unread")
    if unread:
        full = "  FULL: appends wait or get 429 until consumers acknowledge" if unread.get("full") else ""
        lines.append(
            f"  unread     {unread['items']} of {unread['max_items']} records, {unread['bytes']} of"
            f" {unread['max_bytes']} bytes (after {unread['after_sequence']}){full}"
        )
    total = state.get("total")
    if total and (total.get("max_items") or total.get("max_bytes")):
        lines.append(
            f"  total      {total['items']} of {total.get('max_items') or 'unlimited'} records, {total['bytes']} of"
            f" {total.get('max_bytes') or 'unlimited'} bytes"
        )
    consumers = state.get("consumers")
    if consumers is not None:
        shown = ", ".join(f"{c['consumer_id']} at {c['acked_sequence']} (lag {c['lag']})" for c in consumers)
        lines.append(f"  consumers  {shown or 'none (every retained record counts as unread)'}")
    lines.append(f"  closed     {'yes, by ' + str(state.get('closed_by')) if state.get('closed') else 'no'}")
    lines.append(f"  holds      {holds}")
    deliveries = state.get("deliveries")
    if deliveries:
        lines.append("  deliveries " + ", ".join(f"{n} {s}" for s, n in deliveries.items()))
    in_flight = state.get("objects_in_flight")
    if in_flight and any(in_flight.values()):
        lines.append("  uploading  " + ", ".join(f"{n} {s}" for s, n in in_flight.items()))
    if owner:
        lines.append(f"  owner      {owner.get('kind')} {owner.get('namespace')}/{owner.get('name')}")
    lines.append(f"  created    {body.get('created_at')} by {body.get('created_by')}")
    lines.append(f"  pins       {body.get('pins_digest')}")
    return "\n".join(lines)


async def _ls(args: argparse.Namespace) -> None:
    if args.run_id is None:
        await _ls_runs(args)
        return
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
    _table(rows)


async def _ls_runs(args: argparse.Namespace) -> None:
    async with _client(args) as client:
        runs = await client.list_runs()
    if args.json:
        print(json.dumps(runs), flush=True)
        return
    if not runs:
        print("no runs with a stream that you may see", flush=True)
        return
    _table(
        [("RUN", "STREAMS", "LATEST CREATED")]
        + [(r["run_id"], str(r["streams"]), r["latest_created_at"]) for r in runs]
    )


def _table(rows: Sequence[tuple[str, ...]]) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip(), flush=True)


async def _read(args: argparse.Namespace) -> None:
    if not 1 <= args.limit <= CATCH_UP_RECORDS:
        raise UsageError("invalid_argument", f"--limit must be 1-{CATCH_UP_RECORDS}")
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


async def _download(args: argparse.Namespace) -> None:
    to_stdout = args.output in (None, "-")
    if args.output is None and sys.stdout.isatty():
        raise UsageError("invalid_argument", "the object's bytes would go to a terminal: give --output FILE (or '-')")
    async with _client(args) as client:
        with tqdm(unit="B", unit_scale=True, desc="download", disable=_progress_disabled(args), file=sys.stderr) as bar:

            def received(done: int, size: int) -> None:
                bar.total = size
                bar.update(done - bar.n)

            if to_stdout:
                info = await client.download_object(
                    args.run_id, args.stream_id, args.sequence, sys.stdout.buffer.write, progress=received
                )
                sys.stdout.buffer.flush()
            else:
                info = await client.save_object(
                    args.run_id, args.stream_id, args.sequence, Path(args.output), progress=received
                )
    if not to_stdout:
        text = f"wrote {args.output} ({info.size} bytes, {info.content_type}, sha256 {info.sha256})"
        _emit(
            args,
            {"path": args.output, "size": info.size, "content_type": info.content_type, "sha256": info.sha256},
            text,
        )


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
    print(argcomplete.shellcode(["workflow-streams"], shell=args.shell), end="")  # type: ignore[attr-defined,unused-ignore]
    return 0


def _wait_args(parser: argparse.ArgumentParser, until: str) -> None:
    parser.add_argument("--timeout", type=float, default=60.0, help=f"seconds to wait {until} (default: 60)")
    parser.add_argument("--no-wait", action="store_true", help="only send the request; do not wait " + until)


async def _hold(args: argparse.Namespace) -> None:
    kube = KubeClient()
    namespace = args.namespace or kube.namespace
    name = args.name or f"{args.stream}-{args.matter}".lower()
    # a hold on a stream that does not exist would only wait for an operator that cannot apply it; a
    # principal that may not read WorkflowStreams (the legal-hold role) skips the check
    if await kube.stream_exists(namespace, args.stream) is False:
        raise LookupError(
            f"no WorkflowStream {args.stream!r} in namespace {namespace} (kubectl get wfs -n {namespace});"
            " no hold was created"
        )
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
    try:
        await kube.delete_hold(namespace, args.name)
    except LookupError:
        raise LookupError(
            f"no such hold: streamlegalhold {args.name!r} in namespace {namespace} (kubectl get wfhold -n {namespace})"
        ) from None
    if args.no_wait:
        print(
            f"streamlegalhold.workflowstreams.dev/{args.name} deletion requested: the stream stays held until the "
            f"operator has released it and the object is gone (kubectl get wfhold {args.name} -n {namespace})"
        )
        return
    await kube.wait_hold_gone(namespace, args.name, args.timeout)
    print(f"streamlegalhold.workflowstreams.dev/{args.name} released")
