"""python -m nvfp4kv.bench: speed of the CUDA append kernel against the GPU's own limits.

In ONE run it measures
  * the bandwidth ceiling: a device-to-device copy of a few GiB (bytes read + bytes written per second);
  * the launch floor: an empty kernel replayed in a CUDA graph (time per launch);
  * every case of issue 3 (8 KV heads, page size 16, bf16): decode nnz 1..1024 (one token per request;
    per launch, and per launch inside a CUDA graph), prefill nnz 4096/16384/65536 NHD and HND at
    head_dim 128, and nnz 16384 at head_dim 64 and 256: time, GB/s (bf16 K+V read + packed data +
    scales written) and % of the copy ceiling;
  * the same shapes through a straightforward pure-PyTorch implementation (what a user without this
    library would write), for the speed-up;
  * the eager host overhead of the Python API on a tiny input, against one Tensor.index_copy_.
Times are medians of many CUDA-event samples after warm-up. Every sample walks fresh input sets
(keys, values, index tensors and the cache pages they address), rotated over more than 4x the L2
size; where the sets of a small case cannot add up to that, L2 is flushed before each sample, so
every launch still reads its inputs from memory. Writes a JSON file and a PNG chart (matplotlib,
optional) and shows a progress bar (tqdm when installed).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional

import torch

import nvfp4kv
from nvfp4kv import reference

HEADS = 8
PAGE_SIZE = 16
DTYPE = torch.bfloat16


# --- progress ----------------------------------------------------------------------------------------

class _SimpleBar:
    def __init__(self, total: int, desc: str):
        self.total, self.n, self.desc, self.start = total, 0, desc, time.time()

    def update(self, n: int = 1) -> None:
        self.n += n
        width = 30
        done = int(width * self.n / max(1, self.total))
        sys.stderr.write(f"\r{self.desc} [{'#' * done}{'.' * (width - done)}] {self.n}/{self.total} "
                         f"{time.time() - self.start:5.1f}s")
        sys.stderr.flush()

    def set_postfix_str(self, text: str) -> None:
        self.desc = text

    def close(self) -> None:
        sys.stderr.write("\n")


def progress(total: int, desc: str):
    try:
        from tqdm import tqdm
        return tqdm(total=total, desc=desc, file=sys.stderr)
    except ImportError:
        return _SimpleBar(total, desc)


# --- timing ------------------------------------------------------------------------------------------

class L2Flusher:
    """Reads a buffer of 2x the L2 size, evicting whatever the previous sample left there (reads leave
    clean lines, so the timed kernel pays no write-backs for the flush)."""

    def __init__(self, l2_bytes: int):
        self.buffer = torch.ones(max(2 * l2_bytes, 1 << 20) // 4, dtype=torch.int32, device="cuda")

    def __call__(self) -> None:
        self.buffer.sum()


def time_samples(run: Callable[[int], None], samples: int, calls_per_sample: int, warmup: int,
                 before_sample: Optional[Callable[[], None]] = None) -> List[float]:
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


# --- cases -------------------------------------------------------------------------------------------

@dataclass
class Case:
    name: str
    kind: str  # "decode" or "prefill"
    nnz: int
    head_dim: int
    layout: str
    tokens_per_request: int  # decode: 1
    variant: str = "page_table"  # or "slot_mapping"
    v_sf_layout: str = "linear"
    scale_search: str = "none"
    device_scales: bool = False  # k_scale / v_scale as one-element float32 tensors on the GPU (else floats)
    heads: int = HEADS  # KV heads
    baseline: bool = True  # also time the pure-PyTorch baseline

    @property
    def bytes_moved(self) -> int:
        """bf16 K and V read, packed data and scales written (index reads are not counted)."""
        values = self.nnz * self.heads * self.head_dim
        return 2 * (2 * values + values // 2 + values // 16)


def issue_cases() -> List[Case]:
    cases = [Case(f"decode nnz={n}", "decode", n, 128, "NHD", 1) for n in (1, 8, 64, 256, 1024)]
    for layout in ("NHD", "HND"):
        cases += [Case(f"prefill nnz={n} D=128 {layout}", "prefill", n, 128, layout, 1024)
                  for n in (4096, 16384, 65536)]
    cases += [Case(f"prefill nnz=16384 D={d} NHD", "prefill", 16384, d, "NHD", 1024) for d in (64, 256)]
    # The slot-mapping variant (same targets as the page-table op).
    cases += [Case(f"slots decode nnz={n}", "decode", n, 128, "NHD", 1, "slot_mapping", baseline=False) for n in (1, 64, 1024)]
    cases += [Case(f"slots prefill nnz={n} D=128 NHD", "prefill", n, 128, "NHD", 1024, "slot_mapping",
                   baseline=False)
              for n in (16384, 65536)]
    # The optional formats: trtllm V scales (within 5% of linear), 4-over-6 (>= 80% of the ceiling).
    extra = dict(baseline=False)
    cases += [Case("linear decode nnz=64 HND", "decode", 64, 128, "HND", 1, **extra),
              Case("trtllm decode nnz=64 HND", "decode", 64, 128, "HND", 1, v_sf_layout="trtllm", **extra),
              Case("trtllm prefill nnz=65536 D=128 HND", "prefill", 65536, 128, "HND", 1024, v_sf_layout="trtllm",
                   **extra),
              Case("4over6 prefill nnz=65536 D=128 NHD", "prefill", 65536, 128, "NHD", 1024, scale_search="4over6",
                   **extra)]
    # Per-layer scales kept on the device (serving engines): read by the kernel, no host value.
    cases += [Case(f"device-scale decode nnz={n}", "decode", n, 128, "NHD", 1, device_scales=True, **extra)
              for n in (1, 64)]
    cases += [Case("device-scale prefill nnz=65536 D=128 NHD", "prefill", 65536, 128, "NHD", 1024,
                   device_scales=True, **extra)]
    # One KV head per GPU (a tensor-parallel shard of a GQA model): fewer than 9 threads per row, so the
    # one-item kernel in its "oneshot" mode instead of the pair kernel.
    cases += [Case("1-head prefill nnz=65536 D=128 NHD", "prefill", 65536, 128, "NHD", 1024, heads=1, **extra)]
    return cases


class InputSets:
    """`count` independent input sets of one case: keys, values and index tensors, each addressing its
    own pages of one shared (K, V) cache, so no two sets touch the same bytes."""

    def __init__(self, case: Case, count: int, seed: int = 0):
        g = torch.Generator(device="cuda").manual_seed(seed)
        requests = case.nnz // case.tokens_per_request
        pages_per_request = max(1, math.ceil(case.tokens_per_request / PAGE_SIZE))
        pages_per_set = requests * pages_per_request
        total_pages = count * pages_per_set
        inner = [PAGE_SIZE, case.heads] if case.layout == "NHD" else [case.heads, PAGE_SIZE]
        self.k_cache = torch.zeros(total_pages, *inner, case.head_dim // 2, dtype=torch.uint8, device="cuda")
        self.v_cache = torch.zeros_like(self.k_cache)
        self.k_sf = torch.zeros(total_pages, *inner, case.head_dim // 16, dtype=torch.uint8,
                                device="cuda").view(torch.float8_e4m3fn)
        self.v_sf = torch.zeros_like(self.k_sf)
        self.layout = case.layout
        self.case = case
        self.sets = []
        # Decode rows land at the last slot of a random-length request; prefill rows fill whole requests.
        for i in range(count):
            key = torch.randn(case.nnz, case.heads, case.head_dim, generator=g, device="cuda", dtype=torch.float32)
            value = torch.randn(case.nnz, case.heads, case.head_dim, generator=g, device="cuda", dtype=torch.float32)
            key, value = key.to(DTYPE), value.to(DTYPE)
            page_ids = i * pages_per_set + torch.randperm(pages_per_set, generator=g, device="cuda")
            indptr = torch.arange(0, requests + 1, device="cuda") * pages_per_request
            if case.kind == "decode":
                last = torch.randint(1, PAGE_SIZE + 1, (requests,), generator=g, device="cuda")
                positions = (pages_per_request - 1) * PAGE_SIZE + last - 1
                batch = torch.arange(requests, device="cuda")
            else:
                last = torch.full((requests,), (case.tokens_per_request - 1) % PAGE_SIZE + 1, device="cuda")
                positions = torch.arange(case.tokens_per_request, device="cuda").repeat(requests)
                batch = torch.arange(requests, device="cuda").repeat_interleave(case.tokens_per_request)
            as32 = lambda t: t.to(torch.int32).contiguous()  # noqa: E731
            pages = page_ids[indptr[batch] + positions // PAGE_SIZE]
            self.sets.append(dict(key=key, value=value, batch_indices=as32(batch), positions=as32(positions),
                                  slot_mapping=as32(pages * PAGE_SIZE + positions % PAGE_SIZE),
                                  kv_indices=as32(page_ids), kv_indptr=as32(indptr), kv_last_page_len=as32(last),
                                  k_scale=self._scale(key, case), v_scale=self._scale(value, case)))
        self.bytes_per_set = case.bytes_moved + 4 * (2 * case.nnz + pages_per_set + requests + 1)

    @staticmethod
    def _scale(x: torch.Tensor, case: Case):
        """The calibrated global scale of x: a float, or a float32 tensor on the GPU (device_scales)."""
        amax = float(x.float().abs().max())
        if case.device_scales:
            return nvfp4kv.global_scale_from_amax(torch.tensor([amax], dtype=torch.float32, device="cuda"))
        return nvfp4kv.global_scale_from_amax(amax)

    def append(self, i: int) -> None:
        s = self.sets[i % len(self.sets)]
        options = dict(v_sf_layout=self.case.v_sf_layout, scale_search=self.case.scale_search)
        if self.case.variant == "slot_mapping":
            nvfp4kv.nvfp4_quantize_append_paged_kv_cache_with_slot_mapping(
                s["key"], s["value"], s["slot_mapping"], (self.k_cache, self.v_cache), (self.k_sf, self.v_sf),
                s["k_scale"], s["v_scale"], self.layout, **options)
            return
        nvfp4kv.nvfp4_quantize_append_paged_kv_cache(
            s["key"], s["value"], s["batch_indices"], s["positions"], (self.k_cache, self.v_cache),
            (self.k_sf, self.v_sf), s["kv_indices"], s["kv_indptr"], s["kv_last_page_len"], s["k_scale"],
            s["v_scale"], self.layout, **options)

    def torch_baseline(self, i: int) -> None:
        """What a user without this library would write: quantize with tensor ops (the reference's
        vectorized recipe), then scatter into the cache by advanced indexing."""
        s = self.sets[i % len(self.sets)]
        slot = s["kv_indptr"].long()[s["batch_indices"].long()] + s["positions"].long() // PAGE_SIZE
        page = s["kv_indices"].long()[slot]
        entry = s["positions"].long() % PAGE_SIZE
        for x, cache, sf, scale in ((s["key"], self.k_cache, self.k_sf, s["k_scale"]),
                                    (s["value"], self.v_cache, self.v_sf, s["v_scale"])):
            packed, scales = reference.quantize(x, scale)
            if self.layout == "NHD":
                cache[page, entry] = packed
                sf.view(torch.uint8)[page, entry] = scales.view(torch.uint8)
            else:
                cache.transpose(1, 2)[page, entry] = packed
                sf.view(torch.uint8).transpose(1, 2)[page, entry] = scales.view(torch.uint8)


@dataclass
class CaseResult:
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
    eager: Dict[str, float] = field(default_factory=dict)   # per call, back-to-back eager calls
    torch_baseline: Dict[str, float] = field(default_factory=dict)
    same_size_copy: Dict[str, float] = field(default_factory=dict)  # prefill: a copy of the same bytes


def _rate(stats: Stats, case: Case, ceiling: float) -> Dict[str, float]:
    gbps = case.bytes_moved / stats.median_us / 1e3
    return {**asdict(stats), "gb_per_s": gbps, "pct_of_copy_ceiling": 100 * gbps / ceiling}


def same_size_copy(case: Case, l2_bytes: int, ceiling: float, samples: int) -> Dict[str, float]:
    """What a plain device-to-device copy moving the case's bytes (half read, half written) reaches,
    timed like the kernel: one CUDA graph of copies over buffers rotated through more than 4x the L2.
    Short calls cannot reach the 2 GiB copy's rate; this is the rate at their size."""
    half = case.bytes_moved // 2
    count = max(2, min(64, math.ceil(4.5 * l2_bytes / case.bytes_moved)))
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
    gbps = case.bytes_moved / stats.median_us / 1e3
    return {"median_us": stats.median_us, "gb_per_s": gbps, "pct_of_copy_ceiling": 100 * gbps / ceiling}


def run_case(case: Case, l2_bytes: int, ceiling: float, flusher: L2Flusher, args, bar) -> CaseResult:
    target = 4.5 * l2_bytes
    requests = case.nnz // case.tokens_per_request
    pages = requests * max(1, math.ceil(case.tokens_per_request / PAGE_SIZE))
    per_set = case.bytes_moved + 4 * (2 * case.nnz + pages + requests + 1)  # + the int32 index tensors
    count = max(2, min(args.max_sets, math.ceil(target / per_set)))
    sets = InputSets(case, count)
    rotated = count * per_set
    flush = None if rotated >= target else flusher
    result = CaseResult(case.name, case.kind, case.nnz, case.head_dim, case.layout, case.bytes_moved, count,
                        rotated, flush is not None)

    # Eager: back-to-back calls from Python, each on the next input set (host time included when the
    # kernel is shorter than the host's work per call).
    sets.append(0)
    torch.cuda.synchronize()
    expected_us = case.bytes_moved / (ceiling * 1e3)
    calls = min(count, 64, max(2, int(200 / max(1.0, expected_us))))
    times = time_samples(sets.append, args.samples, calls, warmup=min(count, 20), before_sample=flush)
    result.eager = _rate(Stats.of(times), case, ceiling)
    bar.update(1)

    # The kernel alone: one CUDA graph of `launches` calls over distinct input sets, replayed;
    # time per launch = replay time / launches.
    launches = min(count, args.graph_launches if case.kind == "decode" else calls)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        sets.append(0)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(launches):
            sets.append(i)
    times = time_samples(lambda i: graph.replay(), args.samples, 1, warmup=2, before_sample=flush)
    result.kernel = _rate(Stats.of([t / launches for t in times]), case, ceiling)
    result.kernel["launches_per_graph"] = launches
    del graph
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
        result.same_size_copy = same_size_copy(case, l2_bytes, ceiling, args.samples)
    if not args.no_baseline and case.baseline:
        base_calls = 1 if case.nnz >= 4096 else 4
        times = time_samples(sets.torch_baseline, max(5, args.samples // 4), base_calls, warmup=2,
                             before_sample=flush)
        result.torch_baseline = _rate(Stats.of(times), case, ceiling)
    bar.update(1)
    del sets
    torch.cuda.empty_cache()
    return result


# --- host overhead -----------------------------------------------------------------------------------

def host_overhead(rounds: int, calls: int) -> Dict[str, float]:
    """Wall time per eager call on a tiny input (1 token, 1 head, head_dim 16), GPU work being far
    shorter than the host work; against one Tensor.index_copy_ of the same bytes."""
    key = torch.randn(1, 1, 16, device="cuda", dtype=DTYPE)
    value = torch.randn_like(key)
    cache = tuple(torch.zeros(4, PAGE_SIZE, 1, 8, dtype=torch.uint8, device="cuda") for _ in range(2))
    sf = tuple(torch.zeros(4, PAGE_SIZE, 1, 1, dtype=torch.uint8, device="cuda").view(torch.float8_e4m3fn)
               for _ in range(2))
    idx = lambda *v: torch.tensor(v, dtype=torch.int32, device="cuda")  # noqa: E731
    batch, pos, indices, indptr, last = idx(0), idx(3), idx(2), idx(0, 1), idx(4)
    target = torch.zeros(64, 16, device="cuda", dtype=DTYPE)
    rows = torch.tensor([5], device="cuda")
    src = torch.randn(1, 16, device="cuda", dtype=DTYPE)
    op = torch.ops.nvfp4kv.append_paged_kv_cache.default
    schema_args = len(op._schema.arguments)

    def api():
        nvfp4kv.nvfp4_quantize_append_paged_kv_cache(key, value, batch, pos, cache, sf, indices, indptr, last,
                                                     0.01, 0.01)

    extra = [None, None, "linear", "none"][: schema_args - 14]

    def raw_op():
        op(key, value, batch, pos, cache[0], cache[1], sf[0], sf[1], indices, indptr, last, 0.01, 0.01, "NHD",
           *extra)

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
    named = (("index_copy_us", index_copy), ("api_us", api), ("op_us", raw_op),
             ("op_inference_mode_us", raw_op_inference_mode), ("tensor_add_us", add_))
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


# --- output ------------------------------------------------------------------------------------------

def table(report: dict) -> str:
    c = report["copy_ceiling"]["gb_per_s"]
    lines = [f"device: {report['device']['name']}, {report['device']['sms']} SMs, L2 {report['device']['l2_mib']:.0f} MiB",
             f"copy ceiling: {c:.0f} GB/s (read + write, {report['copy_ceiling']['bytes_copied'] / 2**30:.0f} GiB copy); "
             f"launch floor (empty kernel in a graph): {report['launch_floor']['us_per_launch']:.2f} us",
             "kernel: per launch inside a CUDA graph (inputs from memory); warm: the same with inputs in L2; "
             "eager: per back-to-back Python call; copy: a copy of the same bytes timed the same way (prefill), "
             "%copy = copy time / kernel time",
             "",
             f"{'case':30s} {'kernel us':>9s} {'GB/s':>6s} {'%ceil':>6s} {'warm us':>8s} {'eager us':>9s} "
             f"{'torch us':>9s} {'speed-up':>8s} {'copy us':>8s} {'%copy':>6s}"]
    for r in report["cases"]:
        k, e, b = r["kernel"], r["eager"], r.get("torch_baseline") or {}
        warm = f"{k['warm_l2_median_us']:8.2f}" if "warm_l2_median_us" in k else f"{'':8s}"
        base = f"{b['median_us']:9.1f}" if b else f"{'':9s}"
        speedup = f"{b['median_us'] / k['median_us']:7.0f}x" if b else ""
        c = r.get("same_size_copy") or {}
        copy = f"{c['median_us']:8.2f} {100 * c['median_us'] / k['median_us']:5.1f}%" if c else ""
        lines.append((f"{r['name']:30s} {k['median_us']:9.2f} {k['gb_per_s']:6.0f} {k['pct_of_copy_ceiling']:5.1f}% "
                      f"{warm} {e['median_us']:9.2f} {base} {speedup:>8s} {copy}").rstrip())
    h = report.get("host_overhead")
    if h:
        lines += ["", "eager host time per call, tiny input (us): " +
                  ", ".join(f"{k[:-3]} {v:.2f}" for k, v in h.items() if k.endswith("_us")),
                  f"API / Tensor.index_copy_ = {h['api_over_index_copy']:.2f}x "
                  f"(the op through torch.ops alone: {h['op_over_index_copy']:.2f}x)"]
    return "\n".join(lines)


def chart(report: dict, path: Path) -> bool:
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
        if r["name"].split()[0] in ("slots", "linear", "trtllm", "4over6", "device-scale", "1-head"):
            continue  # the chart shows the issue's base cases; the table has every case
        label = "decode" if r["kind"] == "decode" else f"prefill D={r['head_dim']} {r['layout']}"
        rate = r["kernel"]["gb_per_s"]
        series.setdefault(label, []).append((r["nnz"], rate))
        if r.get("torch_baseline") and label in ("decode", "prefill D=128 NHD"):
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
    return True


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nvfp4kv.bench", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("."), help="folder for bench.json and bench.png")
    parser.add_argument("--samples", type=int, default=40, help="timed samples per measurement")
    parser.add_argument("--copy-gib", type=float, default=2.0, help="size of the ceiling copy")
    parser.add_argument("--max-sets", type=int, default=4096, help="most input sets per case")
    parser.add_argument("--graph-launches", type=int, default=1024, help="decode launches per CUDA graph")
    parser.add_argument("--no-baseline", action="store_true", help="skip the pure-PyTorch baseline")
    parser.add_argument("--only", default="",
                        help="run the cases whose name contains one of these comma-separated texts")
    parser.add_argument("--accuracy", action="store_true",
                        help="also write the accuracy report of plain vs 4-over-6 scales (accuracy.json/png)")
    args = parser.parse_args(argv)
    if args.accuracy:
        from . import accuracy
        print(accuracy.write_report(args.out, "cuda" if torch.cuda.is_available() else "cpu"))
    if not torch.cuda.is_available() or not nvfp4kv.library.has_cuda_kernels():
        print("nvfp4kv.bench needs a CUDA GPU and a build with the CUDA kernels", file=sys.stderr)
        return 2

    props = torch.cuda.get_device_properties(0)
    l2_bytes = props.L2_cache_size
    wanted = [text for text in args.only.split(",") if text] or [""]
    cases = [c for c in issue_cases() if any(text in c.name for text in wanted)]
    bar = progress(2 + 3 * len(cases), "nvfp4kv.bench")
    report = {"device": {"name": props.name, "sms": props.multi_processor_count, "l2_mib": l2_bytes / 2**20,
                         "torch": torch.__version__, "cuda": torch.version.cuda},
              "method": "CUDA events, median of samples after warm-up; inputs rotated over > 4x L2 or L2 "
                        "flushed before each sample; GB/s = (bf16 K+V read + packed + scales written) / time"}
    report["copy_ceiling"] = copy_ceiling(args.copy_gib, args.samples)
    bar.update(1)
    report["launch_floor"] = empty_kernel_floor(1000, args.samples)
    bar.update(1)
    ceiling = report["copy_ceiling"]["gb_per_s"]
    flusher = L2Flusher(l2_bytes)
    report["cases"] = []
    for case in cases:
        bar.set_postfix_str(case.name) if hasattr(bar, "set_postfix_str") else None
        report["cases"].append(asdict(run_case(case, l2_bytes, ceiling, flusher, args, bar)))
    report["host_overhead"] = host_overhead(rounds=15, calls=500)
    bar.close()

    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench.json").write_text(json.dumps(report, indent=2))
    drew = chart(report, args.out / "bench.png")
    print(table(report))
    print(f"\nwrote {args.out / 'bench.json'}" + (f" and {args.out / 'bench.png'}" if drew else
                                                 " (install matplotlib for bench.png)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
