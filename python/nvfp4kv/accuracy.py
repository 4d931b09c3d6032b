"""Accuracy report: plain NVFP4 vs the 4-over-6 scale search, through the library's own op.

For several K/V-like distributions and global scales, appends the rows with each recipe, reads them
back, and reports the relative RMS error (||deq - x|| / ||x||) and the max absolute error relative to
max |x|. Used by `python -m nvfp4kv.bench --accuracy`; runs on any device (CPU is fine).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List

import torch

import nvfp4kv

HEADS, HEAD_DIM, TOKENS = 8, 128, 2048


def _distributions(generator: torch.Generator) -> Dict[str, torch.Tensor]:
    shape = (TOKENS, HEADS, HEAD_DIM)
    gaussian = torch.randn(shape, generator=generator)
    outliers = torch.randn(shape, generator=generator)
    channels = torch.randperm(HEAD_DIM, generator=generator)[:6]
    outliers[..., channels] *= torch.empty(6).uniform_(20.0, 50.0, generator=generator)  # per-channel outliers
    # Real-looking heavy tails: a Student-t with 3 degrees of freedom (normal / sqrt(chi2 / 3)).
    chi2 = torch.randn((*shape, 3), generator=generator).pow(2).sum(-1) / 3
    heavy = torch.randn(shape, generator=generator) / chi2.sqrt()
    return {"gaussian": gaussian, "channel outliers": outliers, "heavy tails (t3)": heavy}


def _round_trip(x: torch.Tensor, scale: float, scale_search: str, device: torch.device) -> torch.Tensor:
    """Appends every row through the slot-mapping op (page_size 1, slot = row) and reads it back."""
    rows = x.shape[0]
    cache = torch.zeros(rows, 2, 1, HEADS, HEAD_DIM // 2, dtype=torch.uint8, device=device)
    cache_sf = torch.zeros(rows, 2, 1, HEADS, HEAD_DIM // 16, dtype=torch.float8_e4m3fn, device=device)
    values = x.to(device=device, dtype=torch.bfloat16)
    nvfp4kv.nvfp4_quantize_append_paged_kv_cache_with_slot_mapping(
        values,
        values,
        torch.arange(rows, device=device),
        cache,
        cache_sf,
        scale,
        scale,
        "NHD",
        scale_search=scale_search,
    )
    return nvfp4kv.dequantize(cache[:, 0, 0], cache_sf[:, 0, 0], scale).cpu()


def accuracy_table(device: str = "cpu", seed: int = 0) -> List[dict]:
    generator = torch.Generator().manual_seed(seed)
    results = []
    for name, x in _distributions(generator).items():
        x = x.to(torch.bfloat16).float()  # the exact values the op sees
        calibrated = nvfp4kv.global_scale_from_amax(float(x.abs().max()))
        for label, scale in (
            ("calibrated", calibrated),
            ("calibrated / 4", calibrated / 4),
            ("calibrated x 4096", calibrated * 4096),
            ("1.0", 1.0),
        ):
            row = {"distribution": name, "global_scale": label, "scale": scale}
            for recipe in ("none", "4over6"):
                error = _round_trip(x, scale, recipe, torch.device(device)) - x
                row[f"rel_rms_{recipe}"] = float(error.norm() / x.norm())
                row[f"max_rel_{recipe}"] = float(error.abs().max() / x.abs().max())
            results.append(row)
    return results


def format_table(results: List[dict]) -> str:
    lines = [
        "| distribution | global scale | rel. RMS plain | rel. RMS 4over6 | change | max err / max|x| plain | "
        "max err / max|x| 4over6 |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        change = (r["rel_rms_4over6"] / r["rel_rms_none"] - 1) * 100
        lines.append(
            f"| {r['distribution']} | {r['global_scale']} | {r['rel_rms_none']:.4f} | "
            f"{r['rel_rms_4over6']:.4f} | {change:+.1f}% | {r['max_rel_none']:.4f} | "
            f"{r['max_rel_4over6']:.4f} |"
        )
    return "\n".join(lines)


def plot(results: List[dict], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    labels = [f"{r['distribution']}\n{r['global_scale']}" for r in results]
    positions = range(len(results))
    figure, axis = plt.subplots(figsize=(max(8, len(results) * 0.8), 4.5))
    axis.bar([p - 0.2 for p in positions], [r["rel_rms_none"] for r in results], 0.4, label="plain (SPEC)")
    axis.bar([p + 0.2 for p in positions], [r["rel_rms_4over6"] for r in results], 0.4, label="4-over-6")
    axis.set_xticks(list(positions), labels, rotation=60, ha="right", fontsize=7)
    axis.set_ylabel("relative RMS error")
    axis.set_title("NVFP4 round-trip error: plain vs 4-over-6 block scales")
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return True


def write_report(out_dir: Path, device: str = "cpu") -> str:
    out_dir.mkdir(parents=True, exist_ok=True)
    results = accuracy_table(device)
    (out_dir / "accuracy.json").write_text(json.dumps(results, indent=2))
    plot(results, out_dir / "accuracy.png")
    return format_table(results)


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", default="nvfp4kv_accuracy")
    args = parser.parse_args()
    print(write_report(Path(args.out), args.device))
