"""The bench's outputs: the rows of the JSON report, the JSON file, the text table and the chart."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Dict

from .cases import HEADS, Case


@dataclass
class CaseResult:
    """One row of report["cases"]."""

    name: str
    kind: str
    nnz: int
    head_dim: int
    layout: str
    bytes_moved: int
    input_sets: int
    rotated_bytes: int
    l2_flushed: bool
    kernel: Dict[str, float] = field(default_factory=dict)  # per launch inside a CUDA graph (the kernel)
    eager: Dict[str, float] = field(default_factory=dict)  # per call, back-to-back eager calls
    torch_baseline: Dict[str, float] = field(default_factory=dict)
    same_size_copy: Dict[str, float] = field(default_factory=dict)  # prefill: a copy of the same bytes
    unfused: Dict[str, float] = field(default_factory=dict)  # fused RoPE cases: compiled RoPE, then the append
    # The rest of the case: what the chart groups by, and what the JSON's readers need to tell cases apart.
    tokens_per_request: int = 1
    heads: int = HEADS
    variant: str = "page_table"
    v_sf_layout: str = "linear"
    scale_search: str = "none"
    device_scales: bool = False
    in_chart: bool = False
    chart_baseline: bool = False

    @staticmethod
    def of(case: Case, input_sets: int, rotated_bytes: int, l2_flushed: bool) -> "CaseResult":
        """The row of `case` before its measurements: every field the case has, copied from it."""
        copied = {f.name: getattr(case, f.name) for f in fields(CaseResult) if hasattr(case, f.name)}
        return CaseResult(**copied, input_sets=input_sets, rotated_bytes=rotated_bytes, l2_flushed=l2_flushed)


def write_json(report: dict, path: Path) -> None:
    path.write_text(json.dumps(report, indent=2))


def table(report: dict) -> str:
    device, ceiling = report["device"], report["copy_ceiling"]
    lines = [
        f"device: {device['name']}, {device['sms']} SMs, L2 {device['l2_mib']:.0f} MiB",
        f"copy ceiling: {ceiling['gb_per_s']:.0f} GB/s "
        f"(read + write, {ceiling['bytes_copied'] / 2**30:.0f} GiB copy); "
        f"launch floor (empty kernel in a graph): {report['launch_floor']['us_per_launch']:.2f} us",
        "kernel: per launch inside a CUDA graph (inputs from memory); warm: the same with inputs in L2; "
        "eager: per back-to-back Python call; copy: a copy of the same bytes timed the same way (prefill), "
        "%copy = copy time / kernel time",
        "",
        f"{'case':30s} {'kernel us':>9s} {'GB/s':>6s} {'%ceil':>6s} {'warm us':>8s} {'eager us':>9s} "
        f"{'torch us':>9s} {'speed-up':>8s} {'copy us':>8s} {'%copy':>6s}",
    ]
    for r in report["cases"]:
        k, e, b = r["kernel"], r["eager"], r.get("torch_baseline") or {}
        warm = f"{k['warm_l2_median_us']:8.2f}" if "warm_l2_median_us" in k else f"{'':8s}"
        base = f"{b['median_us']:9.1f}" if b else f"{'':9s}"
        speedup = f"{b['median_us'] / k['median_us']:7.0f}x" if b else ""
        c = r.get("same_size_copy") or {}
        copy = f"{c['median_us']:8.2f} {100 * c['median_us'] / k['median_us']:5.1f}%" if c else ""
        lines.append(
            (
                f"{r['name']:30s} {k['median_us']:9.2f} {k['gb_per_s']:6.0f} {k['pct_of_copy_ceiling']:5.1f}% "
                f"{warm} {e['median_us']:9.2f} {base} {speedup:>8s} {copy}"
            ).rstrip()
        )
    unfused = [r for r in report["cases"] if r.get("unfused")]
    if unfused:
        lines += ["", "fused RoPE + append against the unfused pipeline (compiled RoPE of Q and K, then the append):"]
        lines += [
            f"  {r['name']:30s} fused {r['kernel']['median_us']:8.2f} us, unfused {r['unfused']['median_us']:8.2f} us: "
            f"{r['unfused']['median_us'] / r['kernel']['median_us']:.2f}x"
            for r in unfused
        ]
    h = report.get("host_overhead")
    if h:
        lines += [
            "",
            "eager host time per call, tiny input (us): "
            + ", ".join(f"{k[:-3]} {v:.2f}" for k, v in h.items() if k.endswith("_us")),
            f"API / Tensor.index_copy_ = {h['api_over_index_copy']:.2f}x "
            f"(the op through torch.ops alone: {h['op_over_index_copy']:.2f}x)",
        ]
    return "\n".join(lines)


def series_label(row: dict) -> str:
    """The chart series of a row: decode, or prefill by head_dim and layout."""
    return "decode" if row["kind"] == "decode" else f"prefill D={row['head_dim']} {row['layout']}"


def chart(report: dict, path: Path) -> bool:
    """GB/s against nnz of the rows marked in_chart (and of their pure-PyTorch baseline where marked
    chart_baseline), one line per series_label; False when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    ceiling = report["copy_ceiling"]["gb_per_s"]
    fig, ax = plt.subplots(figsize=(8, 5))
    series = {}
    for r in report["cases"]:
        if not r.get("in_chart"):
            continue  # the chart shows the base cases; the table has every case
        label = series_label(r)
        series.setdefault(label, []).append((r["nnz"], r["kernel"]["gb_per_s"]))
        if r.get("chart_baseline") and r.get("torch_baseline"):
            series.setdefault(f"pure PyTorch, {label}", []).append((r["nnz"], r["torch_baseline"]["gb_per_s"]))
    for label, points in series.items():
        points.sort()
        style = "x:" if label.startswith("pure PyTorch") else "o-"
        ax.plot([p[0] for p in points], [p[1] for p in points], style, label=label)
    ax.axhline(ceiling, color="k", linestyle="--", label=f"copy ceiling {ceiling:.0f} GB/s")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("nnz (appended tokens)")
    ax.set_ylabel("GB/s (bf16 K+V read + NVFP4 data + scales written)")
    ax.set_title(f"nvfp4kv append on {report['device']['name']}")
    ax.legend(fontsize=8)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True
