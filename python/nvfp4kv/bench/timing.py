"""The timing harness (CUDA-event samples, L2 flush, statistics) and the GPU's limits it is measured
against: copy ceiling, empty-kernel launch floor, same-size copy; and the eager host overhead."""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Callable, Dict, List, Optional

import torch

import nvfp4kv

from .cases import DTYPE, PAGE_SIZE


class L2Flusher:
    """Reads a buffer of 2x the L2 size, evicting whatever the previous sample left there (reads leave
    clean lines, so the timed kernel pays no write-backs for the flush)."""

    def __init__(self, l2_bytes: int):
        self.buffer = torch.ones(max(2 * l2_bytes, 1 << 20) // 4, dtype=torch.int32, device="cuda")

    def __call__(self) -> None:
        self.buffer.sum()


def time_samples(
    run: Callable[[int], None],
    samples: int,
    calls_per_sample: int,
    warmup: int,
    before_sample: Optional[Callable[[], None]] = None,
) -> List[float]:
    """Per-call times (us) of `samples` samples, each timed with CUDA events around `calls_per_sample`
    calls run(i) (i counts calls from 0, so callers rotate their inputs)."""
    i = 0
    for _ in range(warmup):
        run(i)
        i += 1
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(samples):
        if before_sample is not None:
            before_sample()
        start.record()
        for _ in range(calls_per_sample):
            run(i)
            i += 1
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / calls_per_sample)
    return times


@dataclass
class Stats:
    median_us: float
    p10_us: float
    p90_us: float
    samples: int

    @staticmethod
    def of(times: List[float]) -> "Stats":
        ordered = sorted(times)
        pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
        return Stats(statistics.median(ordered), pick(0.1), pick(0.9), len(ordered))


def rate(stats: Stats, bytes_moved: int, ceiling: float) -> Dict[str, float]:
    """The stats with the GB/s they mean for `bytes_moved` and its % of the copy ceiling (GB/s)."""
    gbps = bytes_moved / stats.median_us / 1e3
    return {**asdict(stats), "gb_per_s": gbps, "pct_of_copy_ceiling": 100 * gbps / ceiling}


# --- the GPU's limits --------------------------------------------------------------------------------


def copy_ceiling(gib: float, samples: int) -> Dict[str, float]:
    n = int(gib * (1 << 30))
    src = torch.empty(n, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    times = time_samples(lambda i: dst.copy_(src), samples, 1, warmup=3)
    stats = Stats.of(times)
    return {"bytes_copied": n, "median_us": stats.median_us, "gb_per_s": 2 * n / stats.median_us / 1e3}


def empty_kernel_floor(launches: int, samples: int) -> Dict[str, float]:
    """torch.cuda._sleep(0) is a kernel that returns at once: the launch floor, replayed in a graph."""
    torch.cuda._sleep(0)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(launches):
            torch.cuda._sleep(0)
    times = time_samples(lambda i: graph.replay(), samples, 1, warmup=3)
    return {"launches_per_graph": launches, "us_per_launch": Stats.of(times).median_us / launches}


def same_size_copy(bytes_moved: int, l2_bytes: int, ceiling: float, samples: int) -> Dict[str, float]:
    """What a plain device-to-device copy moving `bytes_moved` (half read, half written) reaches,
    timed like the kernel: one CUDA graph of copies over buffers rotated through more than 4x the L2.
    Short calls cannot reach the 2 GiB copy's rate; this is the rate at their size."""
    half = bytes_moved // 2
    count = max(2, min(64, math.ceil(4.5 * l2_bytes / bytes_moved)))
    src = [torch.empty(half, dtype=torch.uint8, device="cuda").random_() for _ in range(count)]
    dst = [torch.empty_like(t) for t in src]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        dst[0].copy_(src[0])
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(count):
            dst[i].copy_(src[i])
    times = time_samples(lambda i: graph.replay(), samples, 1, warmup=2)
    stats = Stats.of([t / count for t in times])
    gbps = bytes_moved / stats.median_us / 1e3
    return {"median_us": stats.median_us, "gb_per_s": gbps, "pct_of_copy_ceiling": 100 * gbps / ceiling}


# --- host overhead -----------------------------------------------------------------------------------


def host_overhead(rounds: int, calls: int) -> Dict[str, float]:
    """Wall time per eager call on a tiny input (1 token, 1 head, head_dim 16), GPU work being far
    shorter than the host work; against one Tensor.index_copy_ of the same bytes."""
    key = torch.randn(1, 1, 16, device="cuda", dtype=DTYPE)
    value = torch.randn_like(key)
    cache = tuple(torch.zeros(4, PAGE_SIZE, 1, 8, dtype=torch.uint8, device="cuda") for _ in range(2))
    sf = tuple(
        torch.zeros(4, PAGE_SIZE, 1, 1, dtype=torch.uint8, device="cuda").view(torch.float8_e4m3fn) for _ in range(2)
    )
    idx = lambda *v: torch.tensor(v, dtype=torch.int32, device="cuda")  # noqa: E731
    batch, pos, indices, indptr, last = idx(0), idx(3), idx(2), idx(0, 1), idx(4)
    target = torch.zeros(64, 16, device="cuda", dtype=DTYPE)
    rows = torch.tensor([5], device="cuda")
    src = torch.randn(1, 16, device="cuda", dtype=DTYPE)
    op = torch.ops.nvfp4kv.append_paged_kv_cache.default
    schema_args = len(op._schema.arguments)

    def api():
        nvfp4kv.nvfp4_quantize_append_paged_kv_cache(
            key, value, batch, pos, cache, sf, indices, indptr, last, 0.01, 0.01
        )

    extra = [None, None, "linear", "none"][: schema_args - 14]

    def raw_op():
        op(key, value, batch, pos, cache[0], cache[1], sf[0], sf[1], indices, indptr, last, 0.01, 0.01, "NHD", *extra)

    def index_copy():
        target.index_copy_(0, rows, src)

    def raw_op_inference_mode():
        with torch.inference_mode():
            raw_op()

    tiny = torch.zeros(1, device="cuda")

    def add_():
        tiny.add_(1.0)

    # Rounds interleave the callables, so drifts of the host's speed hit them alike; the ratios are
    # medians of per-round ratios.
    named = (
        ("index_copy_us", index_copy),
        ("api_us", api),
        ("op_us", raw_op),
        ("op_inference_mode_us", raw_op_inference_mode),
        ("tensor_add_us", add_),
    )
    for _, fn in named:
        for _ in range(200):
            fn()
    torch.cuda.synchronize()
    per_call = {name: [] for name, _ in named}
    for _ in range(rounds):
        for name, fn in named:
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            per_call[name].append((time.perf_counter() - t0) / calls * 1e6)
            torch.cuda.synchronize()
    results = {name: statistics.median(times) for name, times in per_call.items()}

    def ratio(name: str) -> float:
        return statistics.median(a / b for a, b in zip(per_call[name], per_call["index_copy_us"]))

    results["api_over_index_copy"] = ratio("api_us")
    results["op_over_index_copy"] = ratio("op_us")
    return results
