"""What only CUDA has: forced kernel modes (the test hook), programmatic launch and stream order, the
current stream, no synchronisation or allocation, CUDA graphs, torch.compile (also under CUDA graphs),
the fat binary and the exhaustive device codec check. Skipped where CUDA is absent. The byte equality
of the CUDA op with the CPU op and the reference is in tests/test_append.py, which runs on every device.

Every comparison is over the WHOLE storage behind each cache (append_cases.cache_bytes), which starts
as random bytes, so a byte written in the wrong place, or not written, fails.
"""

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from conftest import assert_no_synchronisation_or_allocation, assert_same_caches, has_cuda

import nvfp4kv

from append_cases import clone_cache, make_append_case

pytestmark = pytest.mark.skipif(not has_cuda(), reason="needs a CUDA GPU and a build with the CUDA kernels")
TESTS_DIR = Path(__file__).resolve().parent


def append(case, **kwargs):
    nvfp4kv.nvfp4_quantize_append_paged_kv_cache(*case.args(), **kwargs)


def cuda_tool(name: str):
    """Path of a CUDA toolkit program (nvcc, cuobjdump): on PATH or in /usr/local/cuda/bin; None if neither."""
    fallback = Path("/usr/local/cuda/bin") / name
    return shutil.which(name) or (str(fallback) if fallback.exists() else None)


# --- kernel modes and programmatic launch ------------------------------------------------------------


FORCED_MODE_CASES = (
    dict(decode=True, batch_size=9),
    dict(batch_size=4, max_tokens=300),
    dict(batch_size=3, head_dim=48, max_tokens=200, layout="HND"),
    dict(batch_size=3, head_dim=64, num_heads=1, max_tokens=200, stacked=True),
    dict(batch_size=8, num_heads=8, head_dim=128, max_tokens=400, seed=8),
)
FORMATS = ({}, dict(scale_search="4over6"), dict(v_sf_layout="trtllm", scale_search="4over6"))


@pytest.mark.parametrize("forced_kernel_mode", ["auto", "pair", "oneshot", "split"], indirect=True)
@pytest.mark.parametrize("options", FORMATS, ids=["plain", "4over6", "trtllm-4over6"])
@pytest.mark.parametrize("kw", FORCED_MODE_CASES, ids=["decode", "prefill", "hnd-d48", "stacked-1head", "large"])
def test_every_forced_kernel_mode(forced_kernel_mode, options, kw):
    """Each kernel mode gives the CPU's bytes on decode and prefill cases, with each recipe and V-scale
    layout (the last case is large enough for the pair kernel in auto mode too)."""
    if "v_sf_layout" in options and kw.get("head_dim", 64) % 64 != 0:
        pytest.skip("the trtllm layout needs head_dim % 64 == 0")
    case = make_append_case(**{"seed": 7, **kw})
    # Special values in a few rows: NaN and inf blocks take their own paths.
    case.append_key[0, 0, 3] = float("nan")
    case.append_value[-1, 0, 5] = float("inf")
    gpu, cpu = case.to("cuda"), case.cloned()
    nvfp4kv.nvfp4_quantize_append_paged_kv_cache(*gpu.args(), **options)
    nvfp4kv.nvfp4_quantize_append_paged_kv_cache(*cpu.args(), **options)
    torch.cuda.synchronize()
    assert_same_caches(gpu, cpu, f"mode {forced_kernel_mode}, {options}, {kw}:")


def test_every_forced_kernel_mode_without_programmatic_launch():
    """NVFP4KV_PDL=0 (read once per process) launches plainly: the same bytes, in a fresh process."""
    env = {**os.environ, "NVFP4KV_PDL": "0"}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-x",
            "-p",
            "no:cacheprovider",
            f"{__file__}::test_every_forced_kernel_mode",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=TESTS_DIR.parent,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


@pytest.mark.parametrize("decode", [True, False])
def test_back_to_back_appends_keep_stream_order(decode):
    """Kernels are launched programmatically on sm_90+ (they may start before the previous kernel of the
    stream ends). Appends of different values into the SAME slots, back to back without a sync, must
    still land in stream order: the last one's bytes win everywhere, as on the CPU."""
    kw = dict(decode=True, batch_size=64) if decode else dict(batch_size=6, max_tokens=600)
    first = make_append_case(num_heads=8, head_dim=128, seed=61, **kw)
    g = torch.Generator().manual_seed(62)
    second_values = dict(
        append_key=torch.randn(first.append_key.shape, generator=g).to(first.append_key.dtype),
        append_value=torch.randn(first.append_value.shape, generator=g).to(first.append_value.dtype),
    )
    cpu = first.cloned()
    append(cpu)
    cpu_second = cpu.__class__(**{**cpu.__dict__, **second_values})
    append(cpu_second)
    gpu = first.to("cuda")
    gpu_second = gpu.__class__(**{**gpu.__dict__, **{k: v.cuda() for k, v in second_values.items()}})
    for _ in range(10):
        append(gpu)
        append(gpu_second)
    torch.cuda.synchronize()
    assert_same_caches(gpu_second, cpu_second, "after alternating appends:")


# --- the call path: stream, synchronisation, allocation ---------------------------------------------


def test_runs_on_the_current_stream():
    """New inputs written on a side stream behind a long sleep must be seen: the op is ordered after them."""
    case = make_append_case(decode=True, batch_size=4, seed=81)
    fresh = make_append_case(decode=True, batch_size=4, seed=82)
    gpu, expected = case.to("cuda"), case.cloned()
    expected = expected.__class__(
        **{**expected.__dict__, "append_key": fresh.append_key, "append_value": fresh.append_value}
    )
    append(expected)
    new_key, new_value = fresh.append_key.cuda(), fresh.append_value.cuda()
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)  # ~25 ms of spinning on the side stream
        gpu.append_key.copy_(new_key)
        gpu.append_value.copy_(new_value)
        append(gpu)
    torch.cuda.synchronize()
    assert_same_caches(gpu, expected)


def test_no_synchronisation_and_no_allocation():
    case = make_append_case(decode=True, batch_size=8, seed=91).to("cuda")
    slot_case = make_append_case(batch_size=3, seed=92).to("cuda")
    slots = torch.arange(slot_case.append_key.shape[0], device="cuda")
    k_scale = torch.tensor([case.k_scale], device="cuda")

    def calls():
        append(case)
        nvfp4kv.nvfp4_quantize_append_paged_kv_cache(*case.args()[:9], k_scale, case.v_scale, case.kv_layout)
        nvfp4kv.nvfp4_quantize_append_paged_kv_cache_with_slot_mapping(
            slot_case.append_key,
            slot_case.append_value,
            slots,
            slot_case.paged_kv_cache,
            slot_case.kv_cache_sf,
            slot_case.k_scale,
            slot_case.v_scale,
        )

    assert_no_synchronisation_or_allocation(calls)


# --- CUDA graphs -----------------------------------------------------------------------------------


def _refresh(static, step, page_size):
    """New keys/values/positions/pages for a decode case (row i is request i), same shapes, in place."""
    g = torch.Generator().manual_seed(1000 + step)
    n = static.append_key.shape[0]
    static.append_key.copy_(torch.randn(static.append_key.shape, generator=g).to(static.append_key.dtype))
    static.append_value.copy_(torch.randn(static.append_value.shape, generator=g).to(static.append_value.dtype))
    pages = (static.kv_indptr[1:] - static.kv_indptr[:-1]).cpu().double()
    positions = (torch.rand(n, generator=g).double() * pages * page_size).long()  # any slot of the request
    static.positions.copy_(positions.to(static.positions.dtype))
    perm = torch.randperm(static.kv_indices.numel(), generator=g).to(static.kv_indices.device)
    static.kv_indices.copy_(static.kv_indices[perm])  # pages move between requests; targets stay distinct


@pytest.mark.parametrize("device_scales", [False, True])
@pytest.mark.parametrize("stacked", [False, True])
def test_cuda_graph_replays_match_eager(stacked, device_scales):
    case = make_append_case(
        decode=True, batch_size=8, stacked=stacked, num_heads=4, head_dim=128, page_size=16, max_tokens=60, seed=101
    )
    static = case.to("cuda")
    scales = (torch.tensor([case.k_scale], device="cuda"), torch.tensor([case.v_scale], device="cuda"))

    def step(c):
        k_scale, v_scale = scales if device_scales else (case.k_scale, case.v_scale)
        nvfp4kv.nvfp4_quantize_append_paged_kv_cache(*c.args()[:9], k_scale, v_scale, c.kv_layout)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step(static)  # warm-up outside the capture, as torch recommends
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step(static)
    for replay in range(4):
        _refresh(static, replay, 16)
        if device_scales:
            scales[0].mul_(1.5)
        eager = static.with_caches(clone_cache(static.paged_kv_cache), clone_cache(static.kv_cache_sf))
        graph.replay()
        step(eager)
        torch.cuda.synchronize()
        assert_same_caches(static, eager, f"replay {replay}:")


def test_first_call_of_the_op_inside_a_capture():
    """A fresh process whose very first call of the op is being captured (lazy loading, runtime init)."""
    code = textwrap.dedent(f"""
        import sys, torch
        sys.path.insert(0, {str(TESTS_DIR)!r})
        import nvfp4kv
        from append_cases import make_append_case, cache_bytes
        case = make_append_case(decode=True, batch_size=4, seed=3).to("cuda")
        eager = case.cloned()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            nvfp4kv.nvfp4_quantize_append_paged_kv_cache(*case.args())
        graph.replay()
        nvfp4kv.nvfp4_quantize_append_paged_kv_cache(*eager.args())
        torch.cuda.synchronize()
        for name in ("paged_kv_cache", "kv_cache_sf"):
            assert torch.equal(cache_bytes(getattr(case, name)), cache_bytes(getattr(eager, name))), name
        print("first call inside capture: OK")
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "OK" in result.stdout


# --- torch.compile ---------------------------------------------------------------------------------


def _decode_step(
    key,
    value,
    batch_indices,
    positions,
    cache,
    cache_sf,
    kv_indices,
    kv_indptr,
    kv_last_page_len,
    k_scale: float,
    v_scale: float,
):
    # A little arithmetic around the op, as in a model's decode step.
    nvfp4kv.nvfp4_quantize_append_paged_kv_cache(
        key * 2.0,
        value + 1.0,
        batch_indices,
        positions + 0,
        cache,
        cache_sf,
        kv_indices,
        kv_indptr,
        kv_last_page_len,
        k_scale,
        v_scale,
    )
    return key.float().sum()


@pytest.mark.parametrize("stacked", [False, True])
def test_compiled_decode_step_matches_eager(stacked):
    torch._dynamo.reset()
    case = make_append_case(decode=True, batch_size=8, stacked=stacked, seed=111)
    if not stacked:  # separate allocations: caches sharing a storage are refused under compile
        case = case.with_caches(
            tuple(t.clone() for t in case.paged_kv_cache), tuple(t.clone() for t in case.kv_cache_sf)
        )
    compiled_case, eager_case = case.to("cuda"), case.to("cuda")
    compiled = torch.compile(_decode_step, fullgraph=True)
    for c, fn in ((compiled_case, compiled), (eager_case, _decode_step)):
        fn(
            c.append_key,
            c.append_value,
            c.batch_indices,
            c.positions,
            c.paged_kv_cache,
            c.kv_cache_sf,
            c.kv_indices,
            c.kv_indptr,
            c.kv_last_page_len,
            c.k_scale,
            c.v_scale,
        )
    torch.cuda.synchronize()
    assert_same_caches(compiled_case, eager_case)


class _Decoder(torch.nn.Module):
    """A decode step whose stacked NVFP4 caches are module buffers, updated in place every step."""

    def __init__(self, case):
        super().__init__()
        self.register_buffer("cache", case.paged_kv_cache)
        self.register_buffer("cache_sf", case.kv_cache_sf)
        self.k_scale, self.v_scale = case.k_scale, case.v_scale

    def forward(self, key, value, batch_indices, positions, kv_indices, kv_indptr, kv_last_page_len):
        nvfp4kv.nvfp4_quantize_append_paged_kv_cache(
            key * 2.0,
            value,
            batch_indices,
            positions,
            self.cache,
            self.cache_sf,
            kv_indices,
            kv_indptr,
            kv_last_page_len,
            self.k_scale,
            self.v_scale,
        )
        return key.sum()


def _decoder_inputs(case, step):
    g = torch.Generator().manual_seed(2000 + step)
    key = torch.randn(case.append_key.shape, generator=g).to(case.append_key.dtype).cuda()
    value = torch.randn(case.append_value.shape, generator=g).to(case.append_value.dtype).cuda()
    return key, value, case.batch_indices, case.positions, case.kv_indices, case.kv_indptr, case.kv_last_page_len


def test_compiled_step_in_cuda_graphs_with_module_caches_mark_static_address():
    """mode="reduce-overhead" (CUDA graph trees) with the cache buffers marked as static addresses:
    the step is graphed (no cudagraph skips) and every step's caches equal eager."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    case = make_append_case(decode=True, batch_size=8, stacked=True, seed=121).to("cuda")
    graphed, eager = _Decoder(case.cloned()), _Decoder(case.cloned())
    torch._dynamo.mark_static_address(graphed.cache)
    torch._dynamo.mark_static_address(graphed.cache_sf)
    step = torch.compile(graphed, mode="reduce-overhead", fullgraph=True)
    for i in range(5):
        inputs = _decoder_inputs(case, i)
        step(*inputs)
        eager(*inputs)
        torch.cuda.synchronize()
        assert torch.equal(graphed.cache.view(torch.uint8), eager.cache.view(torch.uint8)), i
        assert torch.equal(graphed.cache_sf.view(torch.uint8), eager.cache_sf.view(torch.uint8)), i
    assert not counters["inductor"].get("cudagraph_skips"), dict(counters["inductor"])


def test_compiled_step_captured_manually_with_module_caches():
    """The other supported way: compile (default mode), warm up, capture the compiled call with
    torch.cuda.graph, then copy each step's inputs into the static inputs and replay."""
    torch._dynamo.reset()
    case = make_append_case(decode=True, batch_size=8, stacked=True, seed=131).to("cuda")
    graphed, eager = _Decoder(case.cloned()), _Decoder(case.cloned())
    step = torch.compile(graphed, fullgraph=True)
    static = [t.clone() for t in _decoder_inputs(case, 0)]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            step(*static)  # compile and warm up (writes the same bytes to the cache again)
    torch.cuda.current_stream().wait_stream(side)
    eager(*static)
    eager(*static)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step(*static)
    for i in range(1, 5):
        for dst, src in zip(static, _decoder_inputs(case, i)):
            dst.copy_(src)
        graph.replay()
        eager(*static)
        torch.cuda.synchronize()
        assert torch.equal(graphed.cache.view(torch.uint8), eager.cache.view(torch.uint8)), i
        assert torch.equal(graphed.cache_sf.view(torch.uint8), eager.cache_sf.view(torch.uint8)), i


# --- the fat binary --------------------------------------------------------------------------------


def test_library_has_sass_for_every_promised_architecture():
    """The fat binary holds SASS for every real architecture of cmake/cuda_architectures.cmake."""
    promised = {a.split("-")[0] for a in nvfp4kv.library.cuda_architectures() if a.endswith("-real")}
    assert promised, nvfp4kv.library.cuda_architectures()
    tool = cuda_tool("cuobjdump")
    if tool is None:
        pytest.skip("cuobjdump not found")
    listing = subprocess.run(
        [tool, "--list-elf", str(nvfp4kv.library.library_path())], capture_output=True, text=True, check=True
    ).stdout
    found = set(re.findall(r"\.sm_(\d+)[a-z]?\.cubin", listing))
    assert promised <= found, listing


# --- the exhaustive device codec check -------------------------------------------------------------


def test_device_codec_check_passes(tmp_path):
    """tests/gpu/codec_check.cu checks the device quantizer against the codec and the spec (every fp32,
    millions of random blocks), built for this GPU's architecture by run_device.sh's build command."""
    nvcc = cuda_tool("nvcc")
    if nvcc is None:
        pytest.skip("nvcc not found")
    major, minor = torch.cuda.get_device_capability()
    binary = tmp_path / "codec_check"
    build = subprocess.run(
        ["bash", str(TESTS_DIR / "gpu" / "build_codec_check.sh"), f"{major}{minor}", str(binary)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NVCC": nvcc},
    )
    assert build.returncode == 0, build.stdout + build.stderr
    result = subprocess.run([str(binary)], capture_output=True, text=True, timeout=280)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "codec_check: PASS" in result.stdout.splitlines(), result.stdout
