"""results.json -> results.md and PNG plots."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def write_report(results: dict[str, Any], out: Path) -> None:
    m = results["machine"]
    lines = [
        "# workflow-streams benchmark",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB, Linux {m['kernel']}, "
        f"Python {m['python']}, {m['postgres']}. {m['note']}.",
        f"Started {results['started']}; {results['seconds_per_measurement']} s per throughput measurement.",
        "",
        "## Append throughput (records/s): HTTP vs the same transaction on asyncpg directly",
        "",
        "| case | ours | direct asyncpg | ratio |",
        "| --- | ---: | ---: | ---: |",
    ]
    for r in results["append"]:
        lines.append(f"| {r['case']} | {r['ours_records_per_s']:,} | {r['direct_records_per_s']:,} | {r['ratio']} |")
    p = results["pgbench"]
    lines += [
        "",
        f"pgbench `-N`, {p['clients']} clients: {p['tps']:,} tps; ours with 8 producers "
        f"{p['ours_8_producers_per_s']:,} appends/s: **ratio {p['ratio']}**.",
        "",
        "## Append → SSE delivery latency (ms) vs a bare committed NOTIFY → LISTEN",
        "",
        "| subscribers | p50 | p99 | p99.9 | NOTIFY p50 | NOTIFY p99 | ratio p50 | ratio p99 |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in results["latency"]:
        o, b = r["ours_ms"], r["listen_notify_ms"]
        lines.append(
            f"| {r['subscribers']} | {o['p50']:.2f} | {o['p99']:.2f} | {o['p99.9']:.2f} | {b['p50']:.2f} | "
            f"{b['p99']:.2f} | {r['ratio_p50']} | {r['ratio_p99']} |"
        )
    c = results["catch_up"]
    lines += [
        "",
        "## Catch-up read from a cold cursor",
        "",
        f"{c['records']:,} records of 1 KiB: ours {c['ours_records_per_s']:,} records/s "
        f"({c['ours_mb_per_s']} MB/s of JSON) vs the same SELECT on asyncpg {c['direct_records_per_s']:,} "
        f"records/s: **ratio {c['ratio']}**.",
        "",
        "## Memory of idle SSE subscribers vs a bare aiohttp server holding idle streams",
        "",
        "| subscribers | ours KiB each | bare aiohttp KiB each | ratio | server RSS MiB |",
        "| ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in results["memory"]:
        lines.append(
            f"| {r['subscribers']:,} | {r['ours_kib_per_subscriber']} | {r['bare_aiohttp_kib_per_stream']} | "
            f"{r['ratio']} | {r['ours_rss_mib']} |"
        )
    if "nats" in results:
        n = results["nats"]
        lines += ["", f"## Peer: {n['version']}", "", "| figure | ours / NATS |", "| --- | ---: |"]
        lines += [f"| {k.replace('_', ' ')} | {v} |" for k, v in n["ratios"].items()]
        lines += [
            "",
            f"NATS throughput {n['throughput']} msgs/s; latency with 1 subscriber "
            f"p50 {n['latency_1_subscriber_ms']['p50']:.2f} ms, p99 {n['latency_1_subscriber_ms']['p99']:.2f} ms.",
        ]
    (out / "results.md").write_text("\n".join(lines) + "\n")

    fig, ax = plt.subplots(figsize=(9, 4.5))
    cases = [r["case"] for r in results["append"]]
    ax.barh(cases, [r["ratio"] for r in results["append"]], color="#4477aa")
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_xlabel("ours / direct asyncpg (records/s)")
    ax.set_title("Append throughput relative to the Postgres transaction alone")
    fig.tight_layout()
    fig.savefig(out / "append_ratio.png", dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4))
    subs = [str(r["subscribers"]) for r in results["latency"]]
    for key, color in (("p50", "#4477aa"), ("p99", "#ee6677"), ("p99.9", "#228833")):
        ax.plot(subs, [r["ours_ms"][key] for r in results["latency"]], marker="o", label=key, color=color)
    ax.axhline(results["latency"][0]["listen_notify_ms"]["p50"], color="gray", linestyle="--", label="NOTIFY p50")
    ax.set_xlabel("subscribers")
    ax.set_ylabel("append → SSE latency (ms)")
    ax.set_yscale("log")
    ax.legend()
    ax.set_title("Delivery latency")
    fig.tight_layout()
    fig.savefig(out / "latency.png", dpi=110)
    plt.close(fig)
