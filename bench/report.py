"""results.json -> results.md."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _ms(latency: dict[str, Any], key: str) -> str:
    return f"{latency[key]:.1f}" if latency.get("n") else "-"


def _errors(errors: dict[str, int]) -> str:
    return ", ".join(f"{k}: {v:,}" for k, v in sorted(errors.items())) or "0"


def _source(source: dict[str, Any]) -> str:
    if "commit" in source:
        state = ", with uncommitted changes" if source["modified"] else ""
        return f"Server code: `{source['package']}` at commit {source['commit'][:10]}{state}.\n"
    return f"Server code: `{source.get('package', '?')}`.\n"


def _per_append(row: dict[str, Any]) -> str:
    """Server CPU per append: the cost the HTTP and application layers add, whatever the rate."""
    return f"{row['server_cores'] / row['appends_per_s'] * 1e6:,.0f}" if row["appends_per_s"] else "-"


def _all_per_append(row: dict[str, Any]) -> str:
    """Generator + server + Postgres CPU per append: on a machine of C cores, C s / this is the most
    appends per second this software could reach there, if nothing else ran."""
    if not row["appends_per_s"]:
        return "-"
    cores = row["generator_cores"] + row["server_cores"] + row["postgres_cores"]
    return f"{cores / row['appends_per_s'] * 1e6:,.0f}"


def _around(around: list[dict[str, int]] | None) -> str:
    if not around:
        return "-"
    return ", ".join(f"{a['tps']:,}" + (f" ({a['autovacuums']} av)" if a["autovacuums"] else "") for a in around)


def _pgbench_cpu(cpu: dict[str, Any] | None) -> str:
    if not cpu:
        return ""
    return (
        f"; CPU cores: pgbench {cpu['client_cores']}, Postgres {cpu['postgres_cores']}, "
        f"all CPU {cpu['cpu_us_per_txn']:,} µs per transaction"
    )


def _bare(bare: dict[str, Any] | None) -> list[str]:
    if not bare:
        return []
    lines = [
        "The bare-server ceiling (`bench/bare.py`): aiohttp with the same workers and GC tuning, answering each "
        "append request (read the body, decode its JSON, 201 with a small JSON document) without Postgres, "
        "driven by the same generator. It is the most any aiohttp server could append on this machine.",
        "",
        "| connections | requests/s | p50 ms | p99 ms | generator CPU | server CPU | server CPU µs / request |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for conns, case in bare["cases"].items():
        lat, rate = case["latency_ms"], case["requests_per_s"]
        lines.append(
            f"| {conns} | {rate:,} | {_ms(lat, 'p50')} | {_ms(lat, 'p99')} | {case['generator_cores']} | "
            f"{case['server_cores']} | {case['server_cores'] / rate * 1e6 if rate else 0:,.0f} |"
        )
    return [*lines, ""]


def write_report(results: dict[str, Any], out: Path) -> None:
    m, c = results["machine"], results["ceilings"]
    workers = results.get("workers")
    timing = results.get("timing", {})
    lines = [
        "# workflow-streams benchmark",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB, Linux {m['kernel']}, "
        f"Python {m['python']}, {m['postgres']}. {m['note']}.",
        f"Started {results['started']}, {results['mode']} mode; server `workflow-streams serve`"
        + (f" `--workers {workers}`" if workers is not None else " (default workers)")
        + "; load from `wfs-loadgen` (Go). CPU columns are cores busy during the measured window "
        "(CPU seconds per second): generator, server (all its processes), Postgres (all backends).",
        "",
        _source(results.get("server_source", {})),
        *([f"Note: {results['note']}", ""] if results.get("note") else []),
        f"## Ceilings: pgbench, {c['clients']} clients, {c['seconds']} s each",
        "",
        "| ceiling | tps |",
        "| --- | ---: |",
        f"| pgbench `-N` (simple update){_pgbench_cpu(c.get('simple_update_cpu'))} | {c['simple_update_tps']:,} |",
        f"| our append transaction, {c['streams']:,} streams (`bench/pgbench/append.sql`) | {c['append_tps']:,} |",
        f"| the same with `pg_notify` before COMMIT (`append_notify.sql`) | {c['append_notify_tps']:,} |",
        "",
        *_bare(c.get("bare")),
        "## Appends: one 100 B record per request, random stream, keep-alive connections",
        "",
        "/ pgbench -N is the ratio to the ceiling above, measured first; / pgbench -N around, to the mean of "
        "pgbench -N run again before and after the case "
        f"({timing.get('around_seconds', '?')} s each, after {timing.get('around_settle', '?')} s of quiet; their "
        "tps, and autovacuum runs during each, in the next column): the machine's speed drifts within minutes.",
        "",
        "| case | appends/s | / pgbench -N | / pgbench -N around | pgbench -N before, after | / append txn "
        "| / with notify | / bare server | p50 ms | p99 ms | max ms "
        "| errors | generator CPU | server CPU | Postgres CPU | server CPU µs / append | all CPU µs / append "
        "| autovacuum runs | appends / transaction |",
        "| --- " + "| ---: " * 3 + "| --- " + "| ---: " * 6 + "| --- " + "| ---: " * 7 + "|",
    ]
    for r in results["appends"]:
        lat = r["latency_ms"]
        lines.append(
            f"| {r['case']} | {r['appends_per_s']:,} | {r['x_pgbench_simple']} | {r.get('x_pgbench_around', '-')} | "
            f"{_around(r.get('pgbench_around'))} | {r['x_pgbench_append']} | "
            f"{r['x_pgbench_append_notify']} | {r.get('x_bare', '-')} | {_ms(lat, 'p50')} | {_ms(lat, 'p99')} | "
            f"{_ms(lat, 'max')} | {_errors(r['errors'])} | {r['generator_cores']} | {r['server_cores']} | "
            f"{r['postgres_cores']} | {_per_append(r)} | {_all_per_append(r)} | {r.get('autovacuums', '?')} | "
            f"{r.get('appends_per_transaction') or '-'} |"
        )
    lines += [
        "",
        "## Live delivery over SSE: append → subscriber latency, every subscriber's sequences checked",
        "",
        "Connect: time until every subscriber had its response and first `retry:` line (server CPU during "
        "it in brackets; then the kernel's listen overflows during the case: connections dropped because an "
        "accept queue was full, whose clients retransmit after 1 s, 3 s — the backlog is capped by "
        f"net.core.somaxconn = {results['machine'].get('somaxconn', '?')} here). "
        "Delivered / expected counts records over the connected subscribers (a subscriber "
        "that never connected is listed below, not counted as missing); duplicates, gaps and missing must be 0.",
        "",
        "| case | connect s | delivered / expected | dup | gaps | missing | p50 ms | p99 ms | max ms "
        "| appends/s sent | generator CPU | server CPU | Postgres CPU | server KiB / subscriber |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in results["sse"]:
        if "failed" in r:
            lines.append(f"| {r['case']} | failed: {r['failed'][:200]} |" + " |" * 12)
            continue
        lat, g = r["latency_ms"], r["generator"]
        connected = "" if r["connected"] == r["subscribers"] else f", **{r['connected']:,} connected**"
        lines.append(
            f"| {r['case']} | {r['connect_s']:.2f} ({r['connect']['server_cpu_s']:.1f} CPU s; "
            f"{r.get('listen_overflows', '?')} overflows){connected} | "
            f"{r['delivered']:,} / {r['expected']:,} | {r['duplicates']} | {r['gaps']} | {r['missing']} | "
            f"{_ms(lat, 'p50')} | {_ms(lat, 'p99')} | {_ms(lat, 'max')} | {g['appends_per_s']:.1f} | "
            f"{r['generator_cores']} | {r['server_cores']} | {r['postgres_cores']} | "
            f"{r['server_kib_per_subscriber']} |"
        )
    problems = [
        f"- {r['case']}: connect errors {_errors(r['generator']['connect_errors'])}; "
        f"disconnects {_errors(r['generator']['disconnects'])}; "
        f"append errors {_errors(r['generator']['append_errors'])}"
        for r in results["sse"]
        if "failed" not in r
        and (r["generator"]["connect_errors"] or r["generator"]["disconnects"] or r["generator"]["append_errors"])
    ]
    if problems:
        lines += ["", "Errors seen by the generator:", "", *problems]
    cu = results.get("catch_up")
    if cu:
        lines += [
            "",
            "## Catch-up read from a cold cursor",
            "",
            f"{cu['records']:,} records of 1 KiB, pages of 1,000: {cu['ours_records_per_s']:,} records/s "
            f"({cu['ours_mb_per_s']} MB/s of JSON) vs the same SELECT on asyncpg {cu['direct_records_per_s']:,} "
            f"records/s: ratio {cu['ratio']}.",
        ]
    if "nats" in results:
        n = results["nats"]
        lines += [
            "",
            f"## Peer: {n['version']} (driven by the Python client, which bounds these figures)",
            "",
            f"Publishes/s by producers: {n['throughput']}; latency with 1 subscriber "
            f"p50 {n['latency_1_subscriber_ms']['p50']:.2f} ms, p99 {n['latency_1_subscriber_ms']['p99']:.2f} ms.",
        ]
    (out / "results.md").write_text("\n".join(lines) + "\n")
