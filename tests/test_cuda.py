"""The CUDA kernels: byte equality with the CPU op and the reference, no synchronisation or allocation,
CUDA graphs, torch.compile (also under CUDA graphs), the fat binary. Skipped where CUDA is absent.

Every comparison is over the WHOLE storage behind each cache (append_cases.cache_bytes), which starts
as random bytes, so a byte written in the wrong place, or not written, fails. The same AppendCase runs
on the CPU and, moved with AppendCase.to (same bytes, same view geometry), on the GPU.

NVFP4KV_TEST_SMALL=1 trims the parameter grids (for compute-sanitizer runs, tests/gpu/run_device.sh).
"""

import ctypes
import inspect
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import nvfp4kv
from nvfp4kv import reference
from append_cases import cache_bytes, clone_cache, make_append_case

CUDA_OK = torch.cuda.is_available() and nvfp4kv.library.has_cuda_kernels()
pytestmark = pytest.mark.skipif(not CUDA_OK, reason="needs a CUDA GPU and a build with the CUDA kernels")
SMALL = os.environ.get("NVFP4KV_TEST_SMALL") == "1"
TESTS_DIR = Path(__file__).resolve().parent

_API_PARAMETERS = inspect.signature(nvfp4kv.nvfp4_quantize_append_paged_kv_cache).parameters
HAS_FORMATS = "v_sf_layout" in _API_PARAMETERS and "scale_search" in _API_PARAMETERS


def append(case, **kwargs):
    nvfp4kv.nvfp4_quantize_append_paged_kv_cache(*case.args(), **kwargs)


def assert_same_caches(a, b, what=""):
    for name in ("paged_kv_cache", "kv_cache_sf"):
        x, y = cache_bytes(getattr(a, name)), cache_bytes(getattr(b, name))
        assert torch.equal(x, y), f"{what} {name}: {int((x != y).sum())} of {x.numel()} bytes differ"


def run_three(case, with_reference=True, **kwargs):
    """The CUDA op, the CPU op and the reference on copies of one CPU case; all caches must agree."""
    gpu, cpu = case.to("cuda"), case.cloned()
    append(gpu, **kwargs)
    append(cpu, **kwargs)
    torch.cuda.synchronize()
    assert_same_caches(gpu, cpu, "CUDA vs CPU:")
    if with_reference:
        ref = case.cloned()
        reference.nvfp4_quantize_append_paged_kv_cache(*ref.args(), **kwargs)
        assert_same_caches(cpu, ref, "CPU vs reference:")
    return gpu


def grid(full, small):
    return small if SMALL else full


# --- byte equality --------------------------------------------------------------------------------

HEAD_DIMS = [16, 48, 64, 80, 128, 192, 256, 512]
PAGE_SIZES = [1, 5, 16, 64]


@pytest.mark.parametrize("head_dim", grid(HEAD_DIMS, [16, 48, 128]))
@pytest.mark.parametrize("page_size", grid(PAGE_SIZES, [1, 16]))
def test_head_dims_and_page_sizes(head_dim, page_size):
    seed = HEAD_DIMS.index(head_dim) * 10 + PAGE_SIZES.index(page_size)
    case = make_append_case(head_dim=head_dim, page_size=page_size, num_heads=2, seed=seed,
                            max_tokens=3 * page_size + 2, layout="NHD" if seed % 2 else "HND")
    run_three(case)


@pytest.mark.parametrize("decode", [False, True])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("stacked", [False, True])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_layouts_caches_dtypes_indices(layout, stacked, dtype, index_dtype, decode):
    if SMALL and (stacked or index_dtype == torch.int64):
        pytest.skip("small grid")
    seed = hash((layout, stacked, str(dtype), str(index_dtype), decode)) % 1000
    case = make_append_case(layout=layout, stacked=stacked, dtype=dtype, index_dtype=index_dtype, head_dim=128,
                            num_heads=4, page_size=16, batch_size=6, decode=decode, seed=seed)
    run_three(case)


@pytest.mark.parametrize("stacked", [False, True])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_strided_inputs_and_cache_views(layout, stacked):
    case = make_append_case(layout=layout, stacked=stacked, strided_input=True, strided_cache=True, head_dim=64,
                            page_size=5, seed=7)
    assert not case.append_key.is_contiguous()
    run_three(case)


def test_tuple_of_stacked_halves():
    case = make_append_case(stacked=True, seed=11)
    run_three(case.with_caches(case.paged_kv_cache.unbind(1), case.kv_cache_sf.unbind(1)))


def test_mixed_index_dtypes():
    case = make_append_case(decode=True, batch_size=5, seed=31)
    run_three(case.__class__(**{**case.__dict__, "positions": case.positions.long(),
                                "kv_indices": case.kv_indices.long()}))


@pytest.mark.parametrize("head_dim,num_heads,batch_size,max_tokens,dtype", grid(
    [(128, 8, 8, 1000, torch.bfloat16),   # > 2^16 blocks: the 2-blocks-per-thread prefill kernel
     (48, 8, 24, 800, torch.float16),     # odd blocks per row: 1 block per thread
     (256, 2, 12, 1000, torch.bfloat16),
     (128, 8, 16, 2000, torch.bfloat16),  # > 2^19 blocks
     (128, 2, 16, 1000, torch.float16)],  # 8 threads per row: the kernel without the shared index chain
    [(128, 8, 8, 1000, torch.bfloat16)]))
def test_large_prefill_kernels(head_dim, num_heads, batch_size, max_tokens, dtype):
    case = make_append_case(head_dim=head_dim, num_heads=num_heads, page_size=16, batch_size=batch_size,
                            max_tokens=max_tokens, dtype=dtype, seed=head_dim + batch_size)
    blocks = case.append_key.shape[0] * num_heads * head_dim // 16
    assert blocks > 1 << 16
    run_three(case, with_reference=not SMALL and blocks < 1 << 19)


def force_kernel_mode(mode: str) -> None:
    """The library's test hook (cpp/src/cuda/build_info.cpp): every aligned call runs `mode`."""
    hook = ctypes.CDLL(str(nvfp4kv.library.library_path())).nvfp4kv_test_force_kernel_mode
    assert hook(mode.encode()) == 0, mode


@pytest.fixture
def forced_kernel_mode(request):
    force_kernel_mode(request.param)
    yield request.param
    force_kernel_mode("auto")


FORCED_MODE_CASES = (dict(decode=True, batch_size=9), dict(batch_size=4, max_tokens=300),
                     dict(batch_size=3, head_dim=48, max_tokens=200, layout="HND"),
                     dict(batch_size=3, head_dim=64, num_heads=1, max_tokens=200, stacked=True),
                     dict(batch_size=8, num_heads=8, head_dim=128, max_tokens=400, seed=8))
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
    for name in ("paged_kv_cache", "kv_cache_sf"):
        assert torch.equal(cache_bytes(getattr(gpu, name)), cache_bytes(getattr(cpu, name))), name


def test_every_forced_kernel_mode_without_programmatic_launch():
    """NVFP4KV_PDL=0 (read once per process) launches plainly: the same bytes, in a fresh process."""
    env = {**os.environ, "NVFP4KV_PDL": "0"}
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                             f"{__file__}::test_every_forced_kernel_mode"], capture_output=True, text=True,
                            timeout=600, env=env, cwd=TESTS_DIR.parent)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


@pytest.mark.parametrize("decode", [True, False])
def test_back_to_back_appends_keep_stream_order(decode):
    """Kernels are launched programmatically on sm_90+ (they may start before the previous kernel of the
    stream ends). Appends of different values into the SAME slots, back to back without a sync, must
    still land in stream order: the last one's bytes win everywhere, as on the CPU."""
    kw = dict(decode=True, batch_size=64) if decode else dict(batch_size=6, max_tokens=600)
    first = make_append_case(num_heads=8, head_dim=128, seed=61, **kw)
    g = torch.Generator().manual_seed(62)
    second_values = dict(append_key=torch.randn(first.append_key.shape, generator=g).to(first.append_key.dtype),
                         append_value=torch.randn(first.append_value.shape, generator=g).to(first.append_value.dtype))
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


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_decode_with_shuffled_requests(layout):
    """nnz == batch_size but batch_indices[i] != i: the kernel's early kv_indptr load misses."""
    case = make_append_case(decode=True, batch_size=12, layout=layout, seed=19)
    perm = torch.randperm(12, generator=torch.Generator().manual_seed(1))
    shuffled = case.__class__(**{**case.__dict__, "append_key": case.append_key[perm], "append_value":
                                 case.append_value[perm], "batch_indices": case.batch_indices[perm],
                                 "positions": case.positions[perm]})
    run_three(shuffled)


def _offset_copy(t, offset_elements):
    """t copied into a fresh buffer at the given storage offset (a misaligned view of the same shape)."""
    flat = torch.empty(t.numel() + offset_elements, dtype=t.dtype)
    view = flat[offset_elements:].view(t.shape)
    view.copy_(t)
    return view


def test_misaligned_inputs_and_caches():
    """Inputs only 2-byte aligned and caches at odd byte offsets: the scalar-access kernel."""
    case = make_append_case(head_dim=64, num_heads=2, page_size=4, seed=23)
    moved = case.__class__(**{**case.__dict__, "append_key": _offset_copy(case.append_key, 1),
                              "append_value": _offset_copy(case.append_value, 3),
                              "paged_kv_cache": tuple(_offset_copy(c, 1) for c in case.paged_kv_cache),
                              "kv_cache_sf": tuple(_offset_copy(c, 3) for c in case.kv_cache_sf)})
    run_three(moved)


def test_special_values_and_extreme_scales():
    """NaN, +-inf, zeros, subnormals and huge values, with global scales far from the data."""
    for seed, scale in enumerate([1e-30, 1e-6, None, 1e3, 3e30]):
        case = make_append_case(head_dim=64, num_heads=4, batch_size=4, max_tokens=20, seed=40 + seed,
                                dtype=torch.float16 if seed % 2 else torch.bfloat16, global_scale=scale)
        key = case.append_key.view(-1)
        g = torch.Generator().manual_seed(seed)
        idx = torch.randperm(key.numel(), generator=g)
        specials = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1e-7, -6e-8, 6e4, -6e4])
        key[idx[:len(specials)]] = specials.to(key.dtype)
        case.append_value.view(-1)[idx[:200]] = (torch.rand(200, generator=g) * 1e-3).to(key.dtype)
        run_three(case)


@pytest.mark.parametrize("scale", [1e-30, None, 3e30, 2.0 ** 121])
def test_four_over_six_pair_kernel_with_extreme_scales(scale):
    """The 4-over-6 pair kernel (a call of > 2^16 blocks per tensor) with special values in the rows and
    global scales where its error estimates do not apply (s < 2^-60, s > 2^60: the exact sums for every
    block) or where it hands the blocks to the codec (s >= 2^120): the CPU's bytes."""
    case = make_append_case(head_dim=128, num_heads=8, batch_size=8, max_tokens=400, seed=70, global_scale=scale)
    assert case.append_key.shape[0] * 8 * 128 // 16 > 1 << 16
    g = torch.Generator().manual_seed(71)
    key = case.append_key.view(-1)
    idx = torch.randperm(key.numel(), generator=g)
    specials = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1e-7, -6e-8, 6e4, -6e4])
    key[idx[:len(specials)]] = specials.to(key.dtype)
    case.append_value[::7] = 0.0  # all-zero blocks among the rest
    run_three(case, with_reference=not SMALL, scale_search="4over6")


@pytest.mark.parametrize("kind", ["batch", "position", "indptr", "page"])
def test_out_of_range_indices_are_skipped(kind):
    """Device index data that points outside the cache is skipped exactly as on the CPU."""
    case = make_append_case(batch_size=6, max_tokens=30, page_size=4, seed=50, index_dtype=torch.int64)
    n = case.batch_indices.numel()
    bad = {f: getattr(case, f).clone() for f in ("batch_indices", "positions", "kv_indptr", "kv_indices")}
    if kind == "batch":
        rows = bad["batch_indices"][::3]
        rows.copy_(torch.tensor([-1, 6, 2**40, -2**62])[torch.arange(rows.numel()) % 4])
    elif kind == "position":
        rows = bad["positions"][::2]
        rows.copy_(torch.tensor([-5, 2**31, 2**31 + 7, 10**6, 2**62])[torch.arange(rows.numel()) % 5])
    elif kind == "indptr":
        bad["kv_indptr"][2] = bad["kv_indptr"][3] + 1  # a decreasing range skips its request
        bad["kv_indptr"][4] = -2**40
    else:
        pages = bad["kv_indices"][::2]
        pages.copy_(torch.tensor([-1, 10**9])[torch.arange(pages.numel()) % 2])
    run_three(case.__class__(**{**case.__dict__, **bad}))


def test_device_scale_tensors():
    """[1] float32 scale tensors read on the device give the bytes of the float scales; a bad one
    (0, NaN, inf) leaves its tensor's rows untouched, as on the CPU."""
    case = make_append_case(decode=True, batch_size=7, seed=61)
    as_floats = case.to("cuda")
    append(as_floats)
    as_tensors = case.to("cuda")
    nvfp4kv.nvfp4_quantize_append_paged_kv_cache(*as_tensors.args()[:9],
                                                 torch.tensor([case.k_scale], device="cuda"),
                                                 torch.tensor([case.v_scale], device="cuda"), case.kv_layout)
    assert_same_caches(as_floats, as_tensors)
    for bad in (0.0, float("nan"), float("inf"), -1.0):
        gpu, cpu = case.to("cuda"), case.cloned()
        for c, dev in ((gpu, "cuda"), (cpu, "cpu")):
            nvfp4kv.nvfp4_quantize_append_paged_kv_cache(*c.args()[:9], torch.tensor([bad], device=dev),
                                                         torch.tensor([case.v_scale], device=dev), case.kv_layout)
        torch.cuda.synchronize()
        assert_same_caches(gpu, cpu, f"bad k_scale {bad}:")


def test_slot_mapping_variant():
    case = make_append_case(batch_size=5, max_tokens=40, page_size=16, seed=71)
    rows, page, entry = reference.resolve_targets(case.batch_indices, case.positions, case.kv_indices,
                                                  case.kv_indptr, case.kv_last_page_len,
                                                  case.paged_kv_cache[0].shape[0], 16)
    slots = torch.full((case.append_key.shape[0],), -1, dtype=torch.int64)
    slots[rows] = page * 16 + entry
    slots[::7] = -1  # padding
    slots[1] = case.paged_kv_cache[0].shape[0] * 16  # past the cache: skipped
    for index_dtype in (torch.int32, torch.int64):
        gpu, cpu = case.to("cuda"), case.cloned()
        for c, dev in ((gpu, "cuda"), (cpu, "cpu")):
            nvfp4kv.nvfp4_quantize_append_paged_kv_cache_with_slot_mapping(
                c.append_key, c.append_value, slots[:-1].to(dev, index_dtype), c.paged_kv_cache, c.kv_cache_sf,
                c.k_scale, c.v_scale, c.kv_layout)
        torch.cuda.synchronize()
        assert_same_caches(gpu, cpu)


@pytest.mark.skipif(not HAS_FORMATS, reason="this build has no v_sf_layout / scale_search")
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("v_sf_layout,scale_search", [("trtllm", "none"), ("linear", "4over6"),
                                                      ("trtllm", "4over6")])
def test_optional_formats(layout, v_sf_layout, scale_search):
    for decode, head_dim, batch_size, max_tokens in [(True, 64, 5, 40), (False, 128, 3, 40),
                                                     (False, 128, 4, 600)]:
        case = make_append_case(layout=layout, head_dim=head_dim, page_size=16, batch_size=batch_size,
                                max_tokens=max_tokens, decode=decode, num_heads=8, seed=head_dim + batch_size)
        run_three(case, with_reference=max_tokens < 100, v_sf_layout=v_sf_layout, scale_search=scale_search)


def test_dequantize_matches_cpu():
    g = torch.Generator().manual_seed(5)
    packed = torch.randint(0, 256, (3, 5, 64), dtype=torch.uint8, generator=g)
    scales = torch.randint(0, 256, (3, 5, 8), dtype=torch.uint8, generator=g)
    scales[0, 0, :3] = torch.tensor([0x7F, 0xFF, 0x00], dtype=torch.uint8)  # NaN, -NaN, 0
    scales = scales.view(torch.float8_e4m3fn)
    for p, s in ((packed, scales), (_offset_copy(packed, 3), _offset_copy(scales, 1))):
        cpu = nvfp4kv.dequantize(p, s, 0.37)
        gpu = nvfp4kv.dequantize(p.cuda(), s.cuda(), 0.37).cpu()
        assert torch.equal(cpu.isnan(), gpu.isnan())
        assert torch.equal(cpu.nan_to_num(123.0).view(torch.int32), gpu.nan_to_num(123.0).view(torch.int32))


# --- the call path: stream, synchronisation, allocation ---------------------------------------------

def test_runs_on_the_current_stream():
    """New inputs written on a side stream behind a long sleep must be seen: the op is ordered after them."""
    case = make_append_case(decode=True, batch_size=4, seed=81)
    fresh = make_append_case(decode=True, batch_size=4, seed=82)
    gpu, expected = case.to("cuda"), case.cloned()
    expected = expected.__class__(**{**expected.__dict__, "append_key": fresh.append_key,
                                     "append_value": fresh.append_value})
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
            slot_case.append_key, slot_case.append_value, slots, slot_case.paged_kv_cache, slot_case.kv_cache_sf,
            slot_case.k_scale, slot_case.v_scale)

    calls()  # warm-up (first-call work of torch and of the library)
    torch.cuda.synchronize()
    allocations = torch.cuda.memory_stats()["allocation.all.allocated"]
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):
            calls()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.cuda.memory_stats()["allocation.all.allocated"] == allocations
    torch.cuda.synchronize()


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
    case = make_append_case(decode=True, batch_size=8, stacked=stacked, num_heads=4, head_dim=128, page_size=16,
                            max_tokens=60, seed=101)
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

def _decode_step(key, value, batch_indices, positions, cache, cache_sf, kv_indices, kv_indptr, kv_last_page_len,
                 k_scale: float, v_scale: float):
    # A little arithmetic around the op, as in a model's decode step.
    nvfp4kv.nvfp4_quantize_append_paged_kv_cache(key * 2.0, value + 1.0, batch_indices, positions + 0, cache,
                                                 cache_sf, kv_indices, kv_indptr, kv_last_page_len, k_scale, v_scale)
    return key.float().sum()


@pytest.mark.parametrize("stacked", [False, True])
def test_compiled_decode_step_matches_eager(stacked):
    torch._dynamo.reset()
    case = make_append_case(decode=True, batch_size=8, stacked=stacked, seed=111)
    if not stacked:  # separate allocations: caches sharing a storage are refused under compile
        case = case.with_caches(tuple(t.clone() for t in case.paged_kv_cache),
                                tuple(t.clone() for t in case.kv_cache_sf))
    compiled_case, eager_case = case.to("cuda"), case.to("cuda")
    compiled = torch.compile(_decode_step, fullgraph=True)
    for c, fn in ((compiled_case, compiled), (eager_case, _decode_step)):
        fn(c.append_key, c.append_value, c.batch_indices, c.positions, c.paged_kv_cache, c.kv_cache_sf,
           c.kv_indices, c.kv_indptr, c.kv_last_page_len, c.k_scale, c.v_scale)
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
        nvfp4kv.nvfp4_quantize_append_paged_kv_cache(key * 2.0, value, batch_indices, positions, self.cache,
                                                     self.cache_sf, kv_indices, kv_indptr, kv_last_page_len,
                                                     self.k_scale, self.v_scale)
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
    tool = shutil.which("cuobjdump") or next(
        (str(p) for p in (Path("/usr/local/cuda/bin/cuobjdump"),) if p.exists()), None)
    if tool is None:
        pytest.skip("cuobjdump not found")
    listing = subprocess.run([tool, "--list-elf", str(nvfp4kv.library.library_path())], capture_output=True,
                             text=True, check=True).stdout
    found = set(re.findall(r"\.sm_(\d+)[a-z]?\.cubin", listing))
    assert promised <= found, listing
