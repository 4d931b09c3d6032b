"""The results as a markdown table, a JSON file and a PNG chart."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List


def table(results: Dict[str, List[Dict]]) -> str:
    names = list(results)
    head = "| recipe | " + " | ".join(f"{n}: ppl | KL" for n in names) + " | rel. RMS K | rel. RMS V |"
    lines = [head, "|---|" + "---:|---:|" * len(names) + "---:|---:|"]
    for i, row in enumerate(results[names[0]]):
        cells = []
        for name in names:
            r = results[name][i]
            cells += [f"{r['perplexity']:.3f}", f"{r['mean_kl']:.4f}"]
        lines.append(
            f"| {row['recipe']} | " + " | ".join(cells) + f" | {row['rel_rms_k']:.4f} | {row['rel_rms_v']:.4f} |"
        )
    return "\n".join(lines)


def write(out_dir: Path, settings: Dict, results: Dict[str, List[Dict]]) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "accuracy.json").write_text(json.dumps({"settings": settings, "results": results}, indent=2) + "\n")
    _plot(results, out_dir / "accuracy.png")


def _plot(results: Dict[str, List[Dict]], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    figure, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    width = 0.8 / len(results)
    for t, (name, rows) in enumerate(results.items()):
        base = rows[0]["perplexity"]
        x = [i + t * width for i in range(len(rows))]
        axes[0].bar(x, [100 * (r["perplexity"] / base - 1) for r in rows], width, label=name)
        axes[1].bar(x, [r["mean_kl"] for r in rows], width, label=name)
    for axis, label in zip(axes, ("perplexity vs first recipe (%)", "mean KL to bf16 K/V (nats)")):
        axis.set_xticks([i + 0.4 - width / 2 for i in range(len(rows))], [r["recipe"] for r in rows], rotation=60)
        axis.set_ylabel(label)
        axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=80)
    plt.close(figure)
