"""Tokens and FLOPs of a block-family update, doubled vs shared-clean BD3LM layout (CPU, no weights).

The passes are the product's: `dllm_train.passes.split` over the rows `plan_token_logp` builds
(every sequence repeated once per Monte-Carlo mask), priced by `Scorer.row_cost` and
`Scorer.shared_tokens` of a scorer on the packed path (`trainer.bd3lm_layout` doubled or
shared). The model is built on the meta device from benchmarks/configs/<name>/config.json (its
shapes only). Per layout and token budget it prints the passes, the tokens they run, the linear
FLOPs (decoder layers on every token, the LM head on the noisy copies only), the attention FLOPs
(allowed query-key pairs of the BD3LM mask, counted per segment) and the ratio doubled / shared.
Noisy copies carry only their noised blocks (`dllm_train.packed_scoring.noised_block_tokens`), so
tokens and pairs depend on the masks: `--masks alternate` (every other response token, every
response block kept) or `--masks bgpo` (BGPO's count masks, `dllm_objectives.count_masks` over the
response: about 1/5 of a copy's response blocks hold no mask and are left out).
Training counts forward + backward (3x the forward) plus one recomputed forward with activation
checkpointing (`--checkpointing`, the recipes' setting).

    uv run python benchmarks/bd3lm_layout_bench.py                       # sdar-bgpo: SDAR-8B, 8 rows, 2048 new, 16 masks
    uv run python benchmarks/bd3lm_layout_bench.py --budgets 16384,32768,65536 --prompt-len 200
    uv run python benchmarks/bd3lm_layout_bench.py --masks bgpo --prompt-len 72    # sdar-bgpo's draw

Wall-clock times come from the product's step on a GPU (benchmarks/rl_iteration_bench.py
--layouts doubled,shared, or benchmarks/e2e_gpu.py --set trainer.bd3lm_layout=doubled).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
for _src in [str(p) for p in sorted(REPO.glob("packages/*/src"))]:
    if _src not in sys.path:
        sys.path.insert(0, _src)

from dllm_models import build_model  # noqa: E402
from dllm_train import Scorer  # noqa: E402
from dllm_train.packed_scoring import noised_block_counts, shares_clean_context  # noqa: E402
from dllm_train.passes import ScoreCall, split  # noqa: E402


def clean_pairs(n: int, block: int) -> int:
    """Keys a clean copy's queries see, summed: clean blocks <= the query's block."""
    return sum(min((i // block + 1) * block, n) for i in range(n))


def noisy_pairs(noisy: torch.Tensor, clean: torch.Tensor, n: int, block: int) -> int:
    """Keys a noisy copy's queries see, summed over its kept blocks (those holding a noised token,
    the others are not in the row): clean blocks < the query's block, and its own block."""
    i = torch.arange(n)
    hit = torch.zeros(-(-n // block), dtype=torch.bool).index_fill_(0, (i // block)[noisy[:n] != clean[:n]], True)
    seen = (i // block) * block + torch.clamp(n - (i // block) * block, max=block)
    return int(seen[hit[i // block]].sum())


def pass_pairs(call: ScoreCall, rows: torch.Tensor, shared: bool, block: int) -> int:
    """Allowed query-key pairs of one pass's BD3LM mask (groups of copies as the scorer forms them;
    rows of real tokens only, no padding)."""
    attn, clean, noisy = call.attention[rows], call.targets[rows], call.noisy[rows]
    follows = shares_clean_context(attn, clean) if shared else torch.zeros(len(rows), dtype=torch.bool)
    total = 0
    for r, n in enumerate(attn.sum(-1).tolist()):
        total += noisy_pairs(noisy[r], clean[r], n, block) + (0 if bool(follows[r]) else clean_pairs(n, block))
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="SDAR-8B-Chat", help="a folder of benchmarks/configs")
    ap.add_argument("--rows", type=int, default=8, help="sequences of the update (prompts x group)")
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--new-tokens", type=int, default=2048)
    ap.add_argument("--mc-num", type=int, default=16, help="Monte-Carlo masks per sequence")
    ap.add_argument("--budgets", default="16384,32768", help="trainer.max_tokens_per_pass values (0: one pass)")
    ap.add_argument("--masks", choices=("alternate", "bgpo"), default="alternate",
                    help="every other response token, or BGPO's count masks over the response")
    ap.add_argument("--checkpointing", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    raw = json.loads((HERE / "configs" / args.model / "config.json").read_text())
    with torch.device("meta"):
        model = build_model(raw)
    block = model.traits.block_length
    if block is None:
        raise SystemExit(f"{args.model} is not a block-diffusion model")
    hidden, vocab = int(raw["hidden_size"]), int(raw["vocab_size"])
    layers, heads, head_dim = int(raw["num_hidden_layers"]), int(raw["num_attention_heads"]), int(raw["head_dim"])
    body = sum(p.numel() for n, p in model.named_parameters() if "embed" not in n and "lm_head" not in n)
    length = args.prompt_len + args.new_tokens
    ids = torch.zeros(args.rows, length, dtype=torch.long)
    ids[:, :] = torch.arange(length) % 1000 + torch.arange(args.rows)[:, None] * 7  # distinct sequences
    rows = ids.repeat_interleave(args.mc_num, 0)
    attn = torch.ones_like(rows, dtype=torch.bool)
    noisy = rows.clone()
    if args.masks == "alternate":
        noisy[:, args.prompt_len::2] = int(model.traits.mask_token_id)
    else:
        from dllm_objectives import count_masks

        response = torch.zeros(args.rows, length, dtype=torch.bool)
        response[:, args.prompt_len:] = True
        plan = count_masks(response, args.mc_num, generator=torch.Generator().manual_seed(0))
        noisy = torch.where(plan.mask.flatten(0, 1), int(model.traits.mask_token_id), rows)
    call = ScoreCall(noisy, attn, rows, None, 1.0)
    passes_of_training = 4 if args.checkpointing else 3  # forward + backward (2x) [+ recomputed forward]
    out: list[dict[str, Any]] = []
    for budget in [int(b) for b in args.budgets.split(",")]:
        for layout in ("doubled", "shared"):
            scorer = Scorer(model, attention="flex", shared_context=layout == "shared")
            passes = split([call], scorer, budget)
            cost = scorer.row_cost(noisy, attn, rows)
            saved = scorer.shared_tokens(noisy, attn, rows)
            tokens = sum(int(cost[p.rows].sum() - saved[p.rows][1:].sum()) for p in passes)
            noisy_tokens = int(noised_block_counts(noisy, attn, rows, block).sum())
            pairs = sum(pass_pairs(call, p.rows, layout == "shared", block) for p in passes)
            linear = 2 * body * tokens * passes_of_training + 2 * hidden * vocab * noisy_tokens * 3
            attention = 4 * heads * head_dim * layers * pairs * passes_of_training
            out.append({"budget": budget, "layout": layout, "passes": len(passes), "tokens": tokens,
                        "linear_tflop": linear / 1e12, "attention_tflop": attention / 1e12,
                        "total_tflop": (linear + attention) / 1e12})
    print(f"{args.model}: {args.rows} rows x {args.mc_num} {args.masks} masks, {args.prompt_len} + {args.new_tokens} tokens, "
          f"block {block}, {body / 1e9:.2f} B decoder parameters, checkpointing={args.checkpointing}")
    print(f"{'budget':>7s} {'layout':>8s} {'passes':>6s} {'tokens':>10s} {'linear TF':>10s} {'attn TF':>9s} "
          f"{'total TF':>9s} {'doubled/shared':>15s}")
    for r in out:
        base = next(x for x in out if x["budget"] == r["budget"] and x["layout"] == "doubled")
        ratio = base["total_tflop"] / r["total_tflop"]
        print(f"{r['budget']:7d} {r['layout']:>8s} {r['passes']:6d} {r['tokens']:10d} {r['linear_tflop']:10.1f} "
              f"{r['attention_tflop']:9.1f} {r['total_tflop']:9.1f} {ratio:15.2f}")
    target = args.json or (os.path.join(os.environ["OUT"], "bd3lm_layout_bench.json") if os.environ.get("OUT") else None)
    if target:
        Path(target).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
