"""`python -m bench.llm_cost [--memories N] [--model M]`: recorded LLM cost per 1,000 archived memories.

The demo history (memory_assets.demo_data) is archived night by night (batches of 500) through the real
Anthropic SDK against the local fake server (testing/fake_llm.py), whose `usage` is computed from
each prompt and answer (~4 characters per token). Batches above the threshold go through Message
Batches, so the ledger prices them at the model's batch price. The figure is the ledger's total
(every paid answer, failures included) divided by the memories archived. The same ledger tokens are
also priced for other models, for comparison (the fake has one tokenizer: a model whose tokenizer
counts more tokens for the same text costs proportionally more).
"""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime

from memory_lib.archival.archive import ArchivalServices
from memory_lib.archival.pipeline import run_batch
from memory_lib.core.config import DEFAULT_ANTHROPIC_MODEL, ArchivalCriteria
from memory_lib.core.pricing import DEFAULT_PRICES, Usage, cost_usd
from memory_lib.llm.embedding import HashingEmbedder
from memory_lib.llm.ledger import usage_of_batches
from memory_lib.llm.summarize import AnthropicSummarizer
from memory_lib.storage.objectstore import LocalObjectStore

from .common import bench_connect, bench_server, scratch_dir

DIM = 64
END = datetime(2026, 6, 1, tzinfo=UTC)
COMPARE = ["claude-haiku-5-5", "claude-3-haiku", "claude-3-5-haiku", "claude-haiku-4-5"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.llm_cost",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--memories", type=int, default=2000, help="archive at least this many (default 2000)")
    p.add_argument(
        "--model",
        default=DEFAULT_ANTHROPIC_MODEL,
        help=f"the configured model (default: llm.anthropic_model's, {DEFAULT_ANTHROPIC_MODEL})",
    )
    args = p.parse_args(argv)

    sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent.parent))
    from memory_assets.demo_data import generate_history
    from memory_lib.storage.store import insert_memories
    from testing.fake_llm import FAKE_API_KEY, FakeLLMServer

    with bench_server() as server, scratch_dir(None, "ma-llmcost-") as root, FakeLLMServer() as fake:
        url = server.create("llmcost", DIM)
        conn = bench_connect(url)
        embedder = HashingEmbedder(dim=DIM)
        items = list(generate_history(end=END, days=540, per_day=(50, 100), users=4))
        vectors = embedder.embed([m.content for m in items])
        insert_memories(
            conn,
            [m.as_new_memory(v, embedder.model) for m, v in zip(items, vectors, strict=True)],
            actor="bench",
        )
        summarizer = AnthropicSummarizer(
            FAKE_API_KEY,
            base_url=fake.base_url,
            model=args.model,
            max_retries=2,
            batch_threshold=200,
            batch_poll_seconds=0.05,
        )
        services = ArchivalServices(summarizer, embedder, LocalObjectStore(root / "objects"))
        archived, keys, n = 0, [], 0
        while archived < args.memories:
            key = f"night-{n}"
            report = run_batch(
                conn, services, ArchivalCriteria(batch_size=500), batch_key=key, as_of=END, actor="bench"
            )
            keys.append(key)
            n += 1
            if report.archived == 0:
                break
            archived += report.archived
        rows = usage_of_batches(conn, keys)
        tokens = Usage()
        for r in rows:
            tokens = tokens + Usage(
                r.input_tokens, r.output_tokens, r.cache_creation_input_tokens, r.cache_read_input_tokens
            )
        recorded = sum(r.cost_usd for r in rows)
        requests = sum(r.requests for r in rows)
        print(
            f"archived {archived} demo memories in {n} batches; {requests} LLM answers "
            f"({', '.join(f'{r.mode}: {r.requests}' for r in rows)}), "
            f"{tokens.input_tokens / requests:.0f} input + {tokens.output_tokens / requests:.0f} output tokens each"
        )
        print("| model | price | USD per 1,000 archived |\n|---|---|---|")
        print(
            f"| {args.model} | recorded (ledger, {'/'.join(sorted({r.mode for r in rows}))}) | "
            f"{1000 * recorded / archived:.4f} |"
        )
        for model in COMPARE:
            for batch in (True, False):
                c = cost_usd(DEFAULT_PRICES, model, tokens, batch=batch)
                print(f"| {model} | {'batch' if batch else 'list'} | {1000 * (c or 0) / archived:.4f} |")
        conn.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
