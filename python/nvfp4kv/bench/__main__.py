"""The bench's command line: options, one case through the timing harness, the whole run."""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import asdict
from pathlib import Path
from typing import List, Optional

import torch

import nvfp4kv

from . import __doc__ as package_doc
from .cases import Case, InputSets, MlaInputSets, RopeInputSets, benchmark_cases
from .report import CaseResult, chart, table, write_json
from .timing import (
    L2Flusher,
    Stats,
    copy_ceiling,
    empty_kernel_floor,
    host_overhead,
    rate,
    same_size_copy,
    time_samples,
)


def parse_args(argv: Optional[List[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m nvfp4kv.bench", description=package_doc.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("."), help="folder for bench.json and bench.png")
    parser.add_argument("--samples", type=int, default=40, help="timed samples per measurement")
    parser.add_argument("--copy-gib", type=float, default=2.0, help="size of the ceiling copy")
    parser.add_argument("--max-sets", type=int, default=4096, help="most input sets per case")
    parser.add_argument("--graph-launches", type=int, default=1024, help="decode launches per CUDA graph")
    parser.add_argument("--no-baseline", action="store_true", help="skip the pure-PyTorch baseline")
    parser.add_argument(
        "--no-unfused",
        action="store_true",
        help="skip the unfused pipeline beside the fused RoPE cases (its RoPE compiles once per case)",
    )
    parser.add_argument(
        "--only", default="", help="run the cases whose name contains one of these comma-separated texts"
    )
    parser.add_argument(
        "--kernel-mode",
        default="auto",
        choices=["auto", "pair", "split", "oneshot"],
        help="force one kernel (the tests' hook, for A/B runs; MLA: split = row kernel, pair = chain kernel; "
        "fused RoPE: split = decode kernel, pair = rows kernel with 2 or 4 rows per CTA, oneshot = one CTA per row)",
    )
    parser.add_argument(
        "--accuracy",
        action="store_true",
        help="also write the accuracy report of plain vs 4-over-6 scales (accuracy.json/png)",
    )
    return parser.parse_args(argv)


def progress_bar_class():
    """tqdm, which the [bench] extra installs; exits with how to get it when it is missing."""
    try:
        from tqdm import tqdm
    except ImportError:
        sys.exit('nvfp4kv.bench needs tqdm: pip install "nvfp4kv[bench]"')
    return tqdm


def graph_times(run, launches: int, samples: int, flush) -> List[float]:
    """Per-launch times (us) of one CUDA graph of `launches` calls run(i), replayed `samples` times."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run(0)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(launches):
            run(i)
    times = time_samples(lambda i: graph.replay(), samples, 1, warmup=2, before_sample=flush)
    return [t / launches for t in times]


def run_case(case: Case, l2_bytes: int, ceiling: float, flusher: L2Flusher, args, bar) -> CaseResult:
    target = 4.5 * l2_bytes
    per_set = case.bytes_per_input_set
    count = max(2, min(args.max_sets, math.ceil(target / per_set)))
    sets = (MlaInputSets if case.kpe_dim else RopeInputSets if case.q_heads else InputSets)(case, count)
    rotated = count * per_set
    flush = None if rotated >= target else flusher
    result = CaseResult.of(case, count, rotated, flush is not None)

    # Eager: back-to-back calls from Python, each on the next input set (host time included when the
    # kernel is shorter than the host's work per call).
    sets.append(0)
    torch.cuda.synchronize()
    expected_us = case.bytes_moved / (ceiling * 1e3)
    calls = min(count, 64, max(2, int(200 / max(1.0, expected_us))))
    times = time_samples(sets.append, args.samples, calls, warmup=min(count, 20), before_sample=flush)
    result.eager = rate(Stats.of(times), case.bytes_moved, ceiling)
    bar.update(1)

    # The kernel alone: one CUDA graph of `launches` calls over distinct input sets, replayed;
    # time per launch = replay time / launches.
    launches = min(count, args.graph_launches if case.kind == "decode" else calls)
    result.kernel = rate(Stats.of(graph_times(sets.append, launches, args.samples, flush)), case.bytes_moved, ceiling)
    result.kernel["launches_per_graph"] = launches
    if case.q_heads and not args.no_unfused:  # the unfused pipeline the fused RoPE op replaces, timed the same way
        sets.unfused(0)  # compiles it before the capture
        result.unfused = rate(
            Stats.of(graph_times(sets.unfused, launches, args.samples, flush)), case.bytes_moved, ceiling
        )
    if case.kind == "decode":
        # Warm caches: a graph of the same number of launches cycling over as few sets as fit in a
        # quarter of L2, replayed back to back, so the inputs and index tensors are L2 hits.
        resident = max(1, min(count, int(l2_bytes / 4 / per_set)))
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for i in range(launches):
                sets.append(i % resident)
        warm = time_samples(lambda i: graph.replay(), args.samples, 1, warmup=3)
        result.kernel["warm_l2_median_us"] = Stats.of([t / launches for t in warm]).median_us
        result.kernel["warm_sets"] = resident
        del graph
    bar.update(1)

    if case.kind == "prefill":
        result.same_size_copy = same_size_copy(case.bytes_moved, l2_bytes, ceiling, args.samples)
    if not args.no_baseline and case.baseline:
        base_calls = 1 if case.nnz >= 4096 else 4
        times = time_samples(sets.torch_baseline, max(5, args.samples // 4), base_calls, warmup=2, before_sample=flush)
        result.torch_baseline = rate(Stats.of(times), case.bytes_moved, ceiling)
    bar.update(1)
    del sets
    torch.cuda.empty_cache()
    return result


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    tqdm = progress_bar_class()
    if args.accuracy:
        from nvfp4kv import accuracy

        print(accuracy.write_report(args.out, "cuda" if torch.cuda.is_available() else "cpu"))
    if not torch.cuda.is_available() or not nvfp4kv.library.has_cuda_kernels():
        print("nvfp4kv.bench needs a CUDA GPU and a build with the CUDA kernels", file=sys.stderr)
        return 2

    nvfp4kv.library.force_kernel_mode(args.kernel_mode)
    props = torch.cuda.get_device_properties(0)
    l2_bytes = props.L2_cache_size
    wanted = [text for text in args.only.split(",") if text] or [""]
    cases = [c for c in benchmark_cases() if any(text in c.name for text in wanted)]
    bar = tqdm(total=2 + 3 * len(cases), desc="nvfp4kv.bench", file=sys.stderr)
    report = {
        "device": {
            "name": props.name,
            "sms": props.multi_processor_count,
            "l2_mib": l2_bytes / 2**20,
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
        },
        "kernel_mode": args.kernel_mode,
        "method": "CUDA events, median of samples after warm-up; inputs rotated over > 4x L2 or L2 "
        "flushed before each sample; GB/s = (bf16 K+V read + packed + scales written) / time",
    }
    report["copy_ceiling"] = copy_ceiling(args.copy_gib, args.samples)
    bar.update(1)
    report["launch_floor"] = empty_kernel_floor(1000, args.samples)
    bar.update(1)
    ceiling = report["copy_ceiling"]["gb_per_s"]
    flusher = L2Flusher(l2_bytes)
    report["cases"] = []
    for case in cases:
        bar.set_postfix_str(case.name)
        report["cases"].append(asdict(run_case(case, l2_bytes, ceiling, flusher, args, bar)))
    report["host_overhead"] = host_overhead(rounds=15, calls=500)
    bar.close()

    args.out.mkdir(parents=True, exist_ok=True)
    write_json(report, args.out / "bench.json")
    drew = chart(report, args.out / "bench.png")
    print(table(report))
    print(
        f"\nwrote {args.out / 'bench.json'}"
        + (f" and {args.out / 'bench.png'}" if drew else " (install matplotlib for bench.png)")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
