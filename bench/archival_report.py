"""What the archival bench runs (its methods, shard processes, dimension) and what it reports: the summary
figures and the tables."""

from __future__ import annotations

import os
from typing import Any

from .common import Report, Table, ratio
from .machine import loadavg

METHODS = {
    "naive": "naive loop (baseline)",
    "batched": "run_batch × 500",
    "batched_lone": "run_batch × 500, no packs (one object per memory)",
    "sharded": "memory-archive archive --until-drained × 2 shards (a process each)",
}
SHARDS = 2  # processes of the sharded run: one per core of the machine the figures were taken on
DIM = 1536


def summary_table(report: Report) -> None:
    """The same keys every run, for the largest size (every size under `by_size`), and their table."""
    by_size: dict[int, dict[str, Any]] = {}
    for n, fig in sorted(report.figures["backlogs"].items()):
        store_name = next(iter(fig["runs"]))  # S3 when it ran: stores are listed S3 first
        naive, batched = fig["runs"][store_name]["naive"], fig["runs"][store_name]["batched"]
        lone = fig["runs"][store_name]["batched_lone"]
        sharded = fig["runs"][store_name]["sharded"]
        sharded_rate = ratio(sharded["archived"], sharded["seconds"])
        rate, naive_rate = (
            ratio(batched["archived"], batched["seconds"]),
            ratio(naive["archived"], naive["seconds"]),
        )
        by_size[n] = {
            "size": n,
            "store": store_name,
            "rate_per_s": rate,
            "naive_rate_per_s": naive_rate,
            "ratio_vs_naive": ratio(rate, naive_rate),
            "machine_cpu_ms_per_memory": batched["machine_cpu_ms_per_memory"],
            "cpu_ceiling_per_s": batched["cpu_ceiling_per_s"],
            "cpu_ceiling_ratio_vs_naive": ratio(batched["cpu_ceiling_per_s"], naive_rate),
            "sharded_rate_per_s": sharded_rate,
            "sharded_ratio_vs_naive": ratio(sharded_rate, naive_rate),
            "shards": sharded["shards"],
            "no_packs_rate_per_s": ratio(lone["archived"], lone["seconds"]),
            "no_packs_ratio_vs_naive": ratio(ratio(lone["archived"], lone["seconds"]), naive_rate),
            "restore_rate_per_s": fig["bulk_restore"]["per_s"] if "bulk_restore" in fig else None,
            "vacuum_before_restore_s": fig.get("vacuum_before_restore_s"),
            "peak_rss_mib": batched["peak_rss_mib"],
            "rss_growth_mib": batched["rss_growth_mib"],
            "naive_peak_rss_mib": naive["peak_rss_mib"],
            "checkpoint_bytes_per_archived": batched["checkpoint_bytes_per_archived"],
            "load": {
                "batched": [batched["load_start"], batched["load_end"]],
                "naive": [naive["load_start"], naive["load_end"]],
            },
        }
    largest = by_size[max(by_size)]
    report.figures.update(largest)
    report.figures["machine"] = report.machine
    report.figures["load"] = {
        "cpu_count": os.cpu_count(),
        "loadavg_start": report.machine.get("loadavg_at_start"),
        "loadavg_end": loadavg(),
        "runs": largest["load"],
    }
    report.figures["by_size"] = by_size
    first = by_size[min(by_size)]
    report.tables.insert(
        0,
        Table(
            f"Archival summary ({largest['store']}, offline summarizer, {DIM}-d)",
            [
                "backlog",
                "batched memories/s",
                "naive memories/s",
                "ratio vs naive",
                "machine CPU ms/memory (batched)",
                "CPU ceiling memories/s (ratio vs naive)",
                f"{SHARDS} shard processes memories/s (ratio vs naive)",
                "no packs memories/s",
                "restores/s (after VACUUM (ANALYZE))",
                "peak RSS MiB (batched)",
                "RSS growth during the run MiB",
                "RSS vs smallest backlog",
                "load avg 1-min (start → end of batched run)",
            ],
            [
                [
                    n,
                    r["rate_per_s"],
                    r["naive_rate_per_s"],
                    r["ratio_vs_naive"],
                    r["machine_cpu_ms_per_memory"],
                    f"{r['cpu_ceiling_per_s']:.0f} ({r['cpu_ceiling_ratio_vs_naive']:.2f}×)",
                    f"{r['sharded_rate_per_s']:.0f} ({r['sharded_ratio_vs_naive']:.2f}×)",
                    r["no_packs_rate_per_s"],
                    r["restore_rate_per_s"],
                    r["peak_rss_mib"],
                    r["rss_growth_mib"],
                    ratio(r["peak_rss_mib"], first["peak_rss_mib"]),
                    f"{r['load']['batched'][0][0]} → {r['load']['batched'][1][0]}",
                ]
                for n, r in by_size.items()
            ],
            f"Machine: {os.cpu_count()} CPUs, load average {report.machine.get('loadavg_at_start')} at the start "
            "(1, 5, 15 min): other jobs share it. Baseline: the naive one-memory loop on the same backlog, store "
            "and run. Machine CPU: every core's busy time during the batched run (this process, Postgres, "
            "SeaweedFS and anything else running) per memory archived; the CPU ceiling is the CPU count divided by "
            "it, the rate at which every core would be busy, which no overlap of the run's stages can pass on this "
            "machine. Restores: restore_archives (bulk). Peak RSS: this process, sampled every 50 ms; growth = peak less "
            "the RSS at the run's start (under `bench all` the process holds earlier benchmarks' state; "
            "`bench memory` measures a fresh process).",
        ),
    )


def result_tables(report: Report, n: int, results: dict[str, dict[str, Any]], load_s: float) -> None:
    rows = []
    figures: dict[str, Any] = {"n": n, "load_s": load_s, "runs": {}}
    stores = list(dict.fromkeys(k.split("|")[0] for k in results))
    for store_name in stores:
        naive, batched = results[f"{store_name}|naive"], results[f"{store_name}|batched"]
        for method, res in ((label, results[f"{store_name}|{m}"]) for m, label in METHODS.items()):
            per_s = ratio(res["archived"], res["seconds"])
            rows.append(
                [
                    store_name,
                    method,
                    res["archived"],
                    res["seconds"],
                    per_s,
                    ratio(per_s, ratio(naive["archived"], naive["seconds"])),
                    res["bytes_written"] / max(res["archived"], 1),
                    res["machine_cpu_ms_per_memory"],
                ]
            )
        figures["runs"][store_name] = {
            "naive": naive,
            "batched": batched,
            "batched_lone": results[f"{store_name}|batched_lone"],
            "sharded": results[f"{store_name}|sharded"],
            "speedup": ratio(naive["seconds"], batched["seconds"]),
        }
    report.tables.append(
        Table(
            f"Archival throughput, backlog of {n:,} memories (1536-d, offline summarizer + hashing embedder)",
            [
                "object store",
                "method",
                "archived",
                "seconds",
                "memories/s",
                "throughput vs naive",
                "backup bytes/memory",
                "machine CPU ms/memory",
            ],
            rows,
            "Baseline: the naive loop (read, summarize, embed, put + verify, one transaction per memory) on the same "
            f"backlog and store. Each run ends with exactly the memories it archived gone from hot (checked); "
            f"the naive and no-packs runs archive the first {report.params['baseline']:,} of a larger backlog "
            "(their rate is per memory; same database size), the batched runs all of it. The sharded run is "
            f"{SHARDS} concurrent `memory-archive archive --until-drained --shard i/{SHARDS}` processes (the CLI, "
            "offline summarizer and hashing embedder, defaults otherwise; each process's start included): the "
            "pipeline of run_batch in one process per core.",
        )
    )
    step_names = ["select", "read", "summarize", "embed", "backup", "commit", "claim + gate"]
    step_rows = []
    for key, res in results.items():
        store_name, method = key.split("|")
        total = res["seconds"]
        step_rows.append(
            [store_name, method]
            + [(res["steps"].get(s, 0.0) / total * 100 if s in res["steps"] else None) for s in step_names]
            + [total]
        )
    report.tables.append(
        Table(
            "Archival: share of time per step (%)",
            ["object store", "method", *step_names, "total s"],
            step_rows,
            "run_batch: StepResult.seconds per step summed over batches; 'claim + gate' is the rest of the run "
            "(claim, fidelity read-back, gates, integrity checks). backup = put (verified by its echoed SHA256); fidelity (in claim + gate) reads each backup back; commit (batched) HEADs each object before deleting its original.",
        )
    )
    s3 = next((results[f"{s}|batched"] for s in stores if "restore" in results[f"{s}|batched"]), None)
    if s3 is not None:
        r, p, b = s3["restore"], s3["promotion"], s3["bulk_restore"]
        report.tables.append(
            Table(
                "Restore and re-promotion (S3 store)",
                ["operation", "count", "p50 ms", "p95 ms", "p99 ms", "per second"],
                [
                    [
                        "restore_archives (bulk: groups of 50, multi-row statements)",
                        b["restored"],
                        None,
                        None,
                        None,
                        b["per_s"],
                    ],
                    [
                        "restore_archive (one memory per call)",
                        r["restored"],
                        r["latency_ms"]["p50"],
                        r["latency_ms"]["p95"],
                        r["latency_ms"]["p99"],
                        r["per_s"],
                    ],
                    [
                        "expand (no promotion)",
                        p["expansions"],
                        p["expand_ms"]["p50"],
                        p["expand_ms"]["p95"],
                        p["expand_ms"]["p99"],
                        ratio(1000.0, p["expand_ms"]["p50"]),
                    ],
                    [
                        "expand that re-promotes (one re-promotion)",
                        p["promoted"],
                        p["promote_ms"]["p50"],
                        p["promote_ms"]["p95"],
                        p["promote_ms"]["p99"],
                        ratio(1000.0, p["promote_ms"]["p50"]),
                    ],
                ],
                f"Re-promotion engine: {p['engine']}. Latency includes the verified GET from object storage, the hot "
                f"insert (HNSW) and the audit event, in one transaction. Baseline for restore: archival throughput above. "
                f"Measured after VACUUM (ANALYZE) of memories and archived_memories ({s3['vacuum_s']:.1f} s), as "
                "autovacuum leaves them within a minute of the archival run's deletes.",
            )
        )
        figures["restore"] = r
        figures["bulk_restore"] = b
        figures["vacuum_before_restore_s"] = s3["vacuum_s"]
        figures["promotion"] = p
    report.figures.setdefault("backlogs", {})[n] = figures
    report.figures.setdefault("speedup", {})[n] = {s: figures["runs"][s]["speedup"] for s in stores}
