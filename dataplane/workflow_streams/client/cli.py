"""CLI subcommands on the client: tail, append, ack, hold, release."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from tqdm import tqdm

from .client import StreamsClient
from .errors import ProblemError
from .kube import KubeClient
from .models import Page, Record


def add_commands(sub: Any) -> None:
    def client_args(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--url", default=os.environ.get("WFS_URL", "http://127.0.0.1:8080"))
        parser.add_argument("--token", default=os.environ.get("WFS_TOKEN", ""), help="default: $WFS_TOKEN")
        parser.add_argument("run_id")
        parser.add_argument("stream_id")

    tail = sub.add_parser("tail", help="print records as JSON lines: catch up, then follow")
    client_args(tail)
    tail.add_argument("--after", type=int, default=0)
    tail.add_argument("--count", type=int, help="exit after this many records")
    tail.add_argument("--quiet", action="store_true", help="no progress bar")
    tail.set_defaults(func=lambda a: _run(_tail, a))

    append = sub.add_parser("append", help="append JSON values, or upload a file as an object record")
    client_args(append)
    append.add_argument("data", nargs="*", help="JSON values, one record each")
    append.add_argument("--file", type=Path, help="upload this file (objects API) instead")
    append.add_argument("--content-type", default="application/octet-stream")
    append.add_argument("--key", help="idempotency key")
    append.add_argument("--quiet", action="store_true")
    append.set_defaults(func=lambda a: _run(_append, a))

    ack = sub.add_parser("ack", help="acknowledge through a sequence")
    client_args(ack)
    ack.add_argument("consumer_id")
    ack.add_argument("sequence", type=int)
    ack.set_defaults(func=lambda a: _run(_ack, a))

    hold = sub.add_parser("hold", help="place a legal hold: creates a StreamLegalHold (Kubernetes API)")
    hold.add_argument("stream", help="the WorkflowStream's name")
    hold.add_argument("--namespace", "-n")
    hold.add_argument("--matter", required=True)
    hold.add_argument("--reason", required=True)
    hold.add_argument("--requested-by", required=True)
    hold.add_argument("--name", help="the hold's name (default: <stream>-<matter>)")
    hold.set_defaults(func=lambda a: _run(_hold, a))

    release = sub.add_parser("release", help="release a legal hold: deletes the StreamLegalHold")
    release.add_argument("name")
    release.add_argument("--namespace", "-n")
    release.set_defaults(func=lambda a: _run(_release, a))


def _print(record: Record) -> None:
    print(json.dumps(dataclasses.asdict(record)), flush=True)


def _run(command: Callable[[argparse.Namespace], Coroutine[Any, Any, None]], args: argparse.Namespace) -> int:
    """Run a client command; a refusal from the server or the API server becomes exit status 1."""
    try:
        asyncio.run(command(args))
    except (ProblemError, PermissionError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


async def _tail(args: argparse.Namespace) -> None:
    seen = 0
    async with StreamsClient(args.url, args.token) as client:
        first = await client.read(args.run_id, args.stream_id, args.after, limit=1)
        bar = tqdm(total=first.latest - args.after, unit="rec", desc="catch-up", disable=args.quiet, file=sys.stderr)

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


async def _append(args: argparse.Namespace) -> None:
    async with StreamsClient(args.url, args.token) as client:
        if args.file:
            size = args.file.stat().st_size
            with tqdm(total=size, unit="B", unit_scale=True, desc="upload", disable=args.quiet, file=sys.stderr) as bar:

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
            print(json.dumps({"sequences": [sequence]}))
        else:
            values = [json.loads(text) for text in args.data]
            result = await client.append(args.run_id, args.stream_id, *values, idempotency_key=args.key)
            print(json.dumps({"sequences": result.sequences}))


async def _ack(args: argparse.Namespace) -> None:
    async with StreamsClient(args.url, args.token) as client:
        await client.ack(args.run_id, args.stream_id, args.consumer_id, args.sequence)


async def _hold(args: argparse.Namespace) -> None:
    kube = KubeClient()
    namespace = args.namespace or kube.namespace
    name = args.name or f"{args.stream}-{args.matter}".lower()
    await kube.create_hold(namespace, name, args.stream, args.matter, args.reason, args.requested_by)
    print(f"streamlegalhold.workflowstreams.dev/{name} created")


async def _release(args: argparse.Namespace) -> None:
    kube = KubeClient()
    await kube.delete_hold(args.namespace or kube.namespace, args.name)
    print(f"streamlegalhold.workflowstreams.dev/{args.name} deleted")
