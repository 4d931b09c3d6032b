"""The Python helpers on bad index data and bad metadata.

Index values are device data and may be anything: no helper may read or write out of bounds for any
of them. Metadata (types, dtypes, shapes, devices, host-side values) is refused with an error naming
the public argument. Calls that used to crash the process (ISOLATED_CASES) run in subprocesses, so
that the suite survives a crash: each case's code checks its own result, and the subprocess prints
PASS for it only when that check holds.
"""

import functools
import json
import math
import os
import random
import subprocess
import sys
import textwrap

import pytest
import torch

import nvfp4kv
from nvfp4kv.fp4_quantization import e2m1_and_ufp8sf_scale_to_float

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
INDEX_DTYPES = [torch.int32, torch.int64]
I32_MIN, I32_MAX = -(2**31), 2**31 - 1
I64_MIN, I64_MAX = -(2**63), 2**63 - 1
TESTS_DIR = os.path.dirname(os.path.abspath(__file__))


# A fresh interpreter runs the cases in order, printing START / PASS for each. The first case that
# does not pass (an exception, a crash, a hang) ends it; the next interpreter resumes after that case.
RUNNER = f"""
import json, sys, traceback
sys.path.insert(0, {TESTS_DIR!r})
import test_helper_bad_data as helpers
for case_id, code in json.loads(sys.stdin.read()):
    print("START", case_id, flush=True)
    try:
        exec(code, vars(helpers).copy())
    except BaseException:
        print("FAIL", case_id, json.dumps(traceback.format_exc()), flush=True)
        sys.exit(1)
    print("PASS", case_id, flush=True)
"""


def run_isolated(cases):
    """{case id: "OK" or why it failed} for [(case id, Python code that raises unless the case holds)]."""
    results, pending = {}, list(cases)
    while pending:
        try:
            run = subprocess.run(
                [sys.executable, "-c", RUNNER], input=json.dumps(pending), capture_output=True, text=True, timeout=600
            )
            stdout, stderr, ending = run.stdout, run.stderr, f"exit code {run.returncode}"
        except subprocess.TimeoutExpired as timeout:
            stdout, stderr, ending = timeout.stdout or "", timeout.stderr or "", "timed out"
            stdout, stderr = [s.decode() if isinstance(s, bytes) else s for s in (stdout, stderr)]
        started = None
        for line in stdout.splitlines():
            word, _, rest = line.partition(" ")
            case_id, _, detail = rest.partition(" ")
            if word == "START":
                started = case_id
            elif word == "PASS":
                results[case_id], started = "OK", None
            elif word == "FAIL":
                results[case_id], started = json.loads(detail), None
        ran = [case_id for case_id, _ in pending if case_id in results or case_id == started]
        if started is not None:
            results[started] = f"{ending}; stderr:\n{stderr[-3000:]}"
        if not ran:  # the interpreter failed before the first case
            return {**results, **{case_id: f"{ending}; stderr:\n{stderr[-3000:]}" for case_id, _ in pending}}
        if len(ran) == len(pending) and all(results[case_id] == "OK" for case_id in ran) and ending != "exit code 0":
            results[ran[-1]] = f"every case passed but the interpreter ended with {ending}; stderr:\n{stderr[-3000:]}"
        pending = pending[len(ran) :]
    return results


@functools.lru_cache(maxsize=None)
def isolated_results(device):
    """The results of every case of ISOLATED_CASES on `device`, run once per device."""
    cases = [(case_id, make(device)) for case_id, make in ISOLATED_CASES.items()]
    return run_isolated([(case_id, code) for case_id, code in cases if code is not None])


# case id -> (device -> the case's code, or None where it does not apply); test_isolated_case runs them
ISOLATED_CASES = {}


# ---------------------------------------------------------------- get_batch_indices_positions


def allowed_rows(append_indptr, seq_lens, j):
    """What row j of get_batch_indices_positions may be, in pure Python (exact integers).

    A request b covers j when append_indptr[b] <= j < append_indptr[b+1]; the row is then
    (b, seq_lens[b] - (append_indptr[b+1] - append_indptr[b]) + (j - append_indptr[b])) when that
    position lies in [0, 2**31), else (-1, -1). Rows no request covers are (-1, -1). With a
    non-decreasing append_indptr at most one request covers j and the row is exact; otherwise the
    helper may also drop a covered row to (-1, -1)."""
    targets = set()
    for b in range(len(seq_lens)):
        start, end = append_indptr[b], append_indptr[b + 1]
        if start <= j < end:
            p = seq_lens[b] - (end - start) + (j - start)
            targets.add((b, p) if 0 <= p < 2**31 else (-1, -1))
    if all(x <= y for x, y in zip(append_indptr, append_indptr[1:])):
        assert len(targets) <= 1
        return targets or {(-1, -1)}
    return targets | {(-1, -1)}


def check_rows(append_indptr, seq_lens, nnz, dtype, device) -> None:
    """Calls get_batch_indices_positions and checks every row against allowed_rows."""
    batch_indices, positions = nvfp4kv.get_batch_indices_positions(
        torch.tensor(append_indptr, dtype=dtype, device=device), torch.tensor(seq_lens, dtype=dtype, device=device), nnz
    )
    assert batch_indices.dtype == positions.dtype == torch.int32
    assert batch_indices.shape == positions.shape == (nnz,)
    assert batch_indices.device.type == positions.device.type == torch.device(device).type
    for j, row in enumerate(zip(batch_indices.tolist(), positions.tolist())):
        allowed = allowed_rows(append_indptr, seq_lens, j)
        assert row in allowed, f"row {j}: got {row}, allowed {sorted(allowed)}"


# (id, append_indptr, seq_lens, nnz, dtypes the values fit)
BAD_ROWS = [
    ("decreasing_indptr", [0, -3, 6], [0, 9], 6, INDEX_DTYPES),
    ("huge_count", [0, 100000, 2], [5, 5], 2, INDEX_DTYPES),
    ("overlapping_requests", [0, 5, 2, 6], [5, 5, 5], 6, INDEX_DTYPES),
    ("dip_in_the_middle", [0, 10, 2, 3], [10, 1, 1], 8, INDEX_DTYPES),
    ("negative_counts", [0, 4, 1, 5], [4, 0, 4], 5, INDEX_DTYPES),
    ("negative_start", [-4, 2, 5], [3, 3], 5, INDEX_DTYPES),
    ("counts_exceed_nnz", [0, 3, 9], [5, 6], 4, INDEX_DTYPES),
    ("counts_short_of_nnz", [0, 1, 2], [3, 3], 6, INDEX_DTYPES),
    ("seq_lens_below_counts", [0, 3, 5], [1, 0], 5, INDEX_DTYPES),
    ("negative_seq_lens", [0, 2, 4], [-7, -1], 4, INDEX_DTYPES),
    ("no_requests", [0], [], 3, INDEX_DTYPES),
    ("no_rows", [0, 4], [4], 0, INDEX_DTYPES),
    ("int32_extreme_indptr", [I32_MIN, I32_MAX], [I32_MAX], 3, INDEX_DTYPES),
    ("int32_extreme_seq_lens", [0, 2, 4], [I32_MIN, I32_MAX], 4, INDEX_DTYPES),
    ("int32_alternating", [I32_MAX, I32_MIN, I32_MAX, 0], [I32_MIN, I32_MAX, 1], 4, INDEX_DTYPES),
    ("int64_extreme_indptr", [I64_MIN, I64_MAX], [I64_MAX], 3, [torch.int64]),
    ("int64_extreme_seq_lens", [0, 2, 4], [I64_MIN, I64_MAX], 4, [torch.int64]),
    ("int64_alternating", [I64_MAX, I64_MIN, I64_MAX, 0], [I64_MIN, I64_MAX, 1], 4, [torch.int64]),
    ("int64_start_at_min", [I64_MIN, 3], [3], 3, [torch.int64]),
    ("positions_beyond_int32", [0, 3], [2**40], 3, [torch.int64]),
]


def dtype_name(dtype):
    return str(dtype).removeprefix("torch.")


for name, append_indptr, seq_lens, nnz, dtypes in BAD_ROWS:
    for dtype in dtypes:
        arguments = (append_indptr, seq_lens, nnz, dtype)
        ISOLATED_CASES[f"rows_{name}_{dtype_name(dtype)}"] = lambda device, args=arguments: (
            "check_rows({!r}, {!r}, {!r}, {}, {!r})".format(*args, device)
        )

ISOLATED_CASES["rows_skipped_by_the_op"] = lambda device: textwrap.dedent(f"""
    # The (-1, -1) rows of bad data are skipped by the append op: nothing out of bounds is written.
    device = {device!r}
    batch_indices, positions = nvfp4kv.get_batch_indices_positions(
        torch.tensor([0, -3, 6], device=device), torch.tensor([0, 9], device=device), 8)
    assert batch_indices.tolist() == [1] * 6 + [-1] * 2 and positions.tolist() == [3, 4, 5, 6, 7, 8, -1, -1]
    cache = torch.zeros(3, 2, 16, 1, 8, dtype=torch.uint8, device=device)
    cache_sf = torch.zeros(3, 2, 16, 1, 1, dtype=torch.uint8, device=device).view(torch.float8_e4m3fn)
    rows = torch.ones(8, 1, 16, dtype=torch.bfloat16, device=device)
    index = lambda values: torch.tensor(values, dtype=torch.int32, device=device)
    nvfp4kv.nvfp4_quantize_append_paged_kv_cache(rows, rows, batch_indices, positions, cache, cache_sf,
                                                 index([0, 1]), index([0, 1, 2]), index([16, 16]), 1.0, 1.0)
    written = cache[:, 0, :, 0, 0].cpu() != 0
    assert written[1, 3:9].all() and int(written.sum()) == 6, written
""")


def loop_batch_indices_positions(append_indptr, seq_lens):
    """An independent pure-Python statement of the helper on valid inputs."""
    batch_indices, positions = [], []
    for b in range(len(seq_lens)):
        count = append_indptr[b + 1] - append_indptr[b]
        for i in range(count):
            batch_indices.append(b)
            positions.append(seq_lens[b] - count + i)
    return batch_indices, positions


@pytest.mark.parametrize("device", DEVICES)
def test_batch_indices_positions_matches_a_loop_on_valid_inputs(device):
    for seed in range(200):
        rng = random.Random(seed)
        batch_size = rng.randint(0, 9)
        counts = [rng.choice([0, 1, rng.randint(0, 17)]) for _ in range(batch_size)]
        seq_lens = [c + rng.choice([0, rng.randint(0, 100), rng.randint(0, 2**31 - 1 - c)]) for c in counts]
        append_indptr = [0]
        for c in counts:
            append_indptr.append(append_indptr[-1] + c)
        dtype = rng.choice(INDEX_DTYPES)
        batch_indices, positions = nvfp4kv.get_batch_indices_positions(
            torch.tensor(append_indptr, dtype=dtype, device=device),
            torch.tensor(seq_lens, dtype=dtype, device=device),
            append_indptr[-1],
        )
        expected = loop_batch_indices_positions(append_indptr, seq_lens)
        assert (batch_indices.tolist(), positions.tolist()) == expected, f"seed {seed}"
        assert batch_indices.dtype == positions.dtype == torch.int32, f"seed {seed}"


def compiled_matches_eager(cases) -> None:
    """get_batch_indices_positions under torch.compile(fullgraph=True, dynamic=True) on the CPU gives the
    eager result for each (append_indptr, seq_lens, nnz)."""
    compiled = torch.compile(nvfp4kv.get_batch_indices_positions, fullgraph=True, dynamic=True)
    for append_indptr, seq_lens, nnz in cases:
        args = torch.tensor(append_indptr), torch.tensor(seq_lens), nnz
        got, eager = compiled(*args), nvfp4kv.get_batch_indices_positions(*args)
        assert all(torch.equal(g, e) and g.dtype == e.dtype for g, e in zip(got, eager)), (append_indptr, got, eager)


def test_batch_indices_positions_under_torch_compile():
    compiled_matches_eager([([0, 3, 3, 4, 6], [10, 7, 1, 2], 6), ([0, 2, 7], [5, 9], 7), ([0, 0, 5], [3, 5], 5)])


ISOLATED_CASES["rows_compiled_bad_data"] = lambda device: (
    "compiled_matches_eager([([0, -3, 6], [0, 9], 6), ([0, 1, 2], [3, 3], 5), ([0, 4, 1, 5], [4, 0, 4], 5), "
    "([0, 100000, 2], [5, 5], 2)])"
    if device == "cpu"
    else None
)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA graph capture")
def test_helpers_are_capturable_in_a_cuda_graph():
    kv_indptr = torch.tensor([0, 2, 3, 3], dtype=torch.int32, device="cuda")
    kv_last_page_len = torch.tensor([5, 16, 0], dtype=torch.int32, device="cuda")
    append_indptr = torch.tensor([0, 2, 3, 3], dtype=torch.int32, device="cuda")
    nvfp4kv.get_batch_indices_positions(append_indptr, kv_last_page_len, 3)  # warm-up outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        seq_lens = nvfp4kv.get_seq_lens(kv_indptr, kv_last_page_len, 16)
        batch_indices, positions = nvfp4kv.get_batch_indices_positions(append_indptr, seq_lens, 3)
    graph.replay()
    assert seq_lens.tolist() == [21, 16, 0]
    assert batch_indices.tolist() == [0, 0, 1] and positions.tolist() == [19, 20, 15]
    bad_indptr = [0, 1, -5, 3]
    append_indptr.copy_(torch.tensor(bad_indptr, dtype=torch.int32))  # bad data on replay
    graph.replay()
    for j, row in enumerate(zip(batch_indices.tolist(), positions.tolist())):
        assert row in allowed_rows(bad_indptr, seq_lens.tolist(), j), (j, row)


def index(values, dtype=torch.int64):
    return torch.tensor(values, dtype=dtype)


BATCH_METADATA = [
    ("append_indptr_list", ([0, 1], index([1]), 1), TypeError, "append_indptr must be a 1-D int32 or int64"),
    ("append_indptr_float", (index([0, 1]).float(), index([1]), 1), ValueError, "append_indptr must be a 1-D"),
    ("append_indptr_int16", (index([0, 1]).short(), index([1]), 1), ValueError, "append_indptr must be a 1-D"),
    ("append_indptr_2d", (index([[0, 1]]), index([1]), 1), ValueError, "append_indptr must be a 1-D"),
    ("append_indptr_empty", (index([]), index([]), 0), ValueError, "append_indptr must have at least one"),
    ("seq_lens_none", (index([0, 1]), None, 1), TypeError, "seq_lens must be a 1-D"),
    ("seq_lens_bool", (index([0, 1]), index([1]).bool(), 1), ValueError, "seq_lens must be a 1-D"),
    (
        "seq_lens_too_long",
        (index([0, 1]), index([1, 1]), 1),
        ValueError,
        r"seq_lens must have len\(append_indptr\) - 1 = 1 entries, got 2",
    ),
    ("seq_lens_too_short", (index([0, 1, 2]), index([1]), 2), ValueError, r"seq_lens must have len\(append_indptr\)"),
    ("nnz_bool", (index([0, 1]), index([1]), True), TypeError, "nnz must be a non-negative int, got bool"),
    ("nnz_float", (index([0, 1]), index([1]), 1.0), TypeError, "nnz must be a non-negative int, got float"),
    ("nnz_tensor", (index([0, 1]), index([1]), index(1)), TypeError, "nnz must be a non-negative int, got Tensor"),
    ("nnz_negative", (index([0, 1]), index([1]), -1), ValueError, "nnz must be a non-negative int, got -1"),
]


@pytest.mark.parametrize("args,error,message", [c[1:] for c in BATCH_METADATA], ids=[c[0] for c in BATCH_METADATA])
def test_batch_indices_positions_metadata(args, error, message):
    with pytest.raises(error, match="^nvfp4kv.get_batch_indices_positions: " + message):
        nvfp4kv.get_batch_indices_positions(*args)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs two devices")
def test_helpers_refuse_mixed_devices():
    with pytest.raises(ValueError, match=r"get_batch_indices_positions: seq_lens must be on append_indptr's device"):
        nvfp4kv.get_batch_indices_positions(index([0, 1]).cuda(), index([1]), 1)
    with pytest.raises(ValueError, match=r"get_seq_lens: kv_last_page_len must be on kv_indptr's device"):
        nvfp4kv.get_seq_lens(index([0, 1]), index([1]).cuda(), 16)
    with pytest.raises(ValueError, match=r"ufp8_scale_tensor must be on e2m1_tensor's device"):
        e2m1_and_ufp8sf_scale_to_float(
            torch.zeros(2, 8, dtype=torch.uint8).cuda(),
            torch.zeros(2, 1, dtype=torch.uint8),
            torch.tensor([1.0]),
            16,
            1,
            False,
        )
    cache, cache_sf, kv = small_cache("cuda"), small_cache_sf("cuda"), page_table([0, 1], [0, 1], [4])
    with pytest.raises(ValueError, match=r"dequantize_paged_kv_cache: kv_indices must be on paged_kv_cache's device"):
        nvfp4kv.dequantize_paged_kv_cache(cache, cache_sf, *kv, 1.0, 1.0)
    on_device = page_table([0, 1], [0, 1], [4], "cuda")
    with pytest.raises(ValueError, match=r"dequantize_paged_kv_cache: k_scale as a tensor must be"):
        nvfp4kv.dequantize_paged_kv_cache(cache, cache_sf, *on_device, torch.tensor([1.0], dtype=torch.float64), 1.0)
    # A one-element float32 CPU tensor is read on the host, like a float.
    host_read = nvfp4kv.dequantize_paged_kv_cache(cache, cache_sf, *on_device, torch.tensor([2.0]), 1.0)
    as_float = nvfp4kv.dequantize_paged_kv_cache(cache, cache_sf, *on_device, 2.0, 1.0)
    assert all(torch.equal(a, b) for a, b in zip(host_read, as_float))


# ---------------------------------------------------------------- get_seq_lens


def test_seq_lens_of_any_values_is_plain_arithmetic():
    kv_indptr = index([0, 5, 2, I32_MAX], torch.int32)
    kv_last_page_len = index([-3, 4, I32_MIN], torch.int32)
    assert nvfp4kv.get_seq_lens(kv_indptr, kv_last_page_len, 16).tolist() == [
        4 * 16 - 3,
        0 * 16 + 4,
        (((I32_MAX - 3) * 16 + I32_MIN + 2**31) % 2**32) - 2**31,
    ]


SEQ_LENS_METADATA = [
    ("page_size_zero", (index([0, 1]), index([1]), 0), ValueError, "page_size must be a positive int, got 0"),
    ("page_size_negative", (index([0, 1]), index([1]), -16), ValueError, "page_size must be a positive int, got -16"),
    ("page_size_bool", (index([0, 1]), index([1]), True), TypeError, "page_size must be a positive int, got bool"),
    ("page_size_float", (index([0, 1]), index([1]), 16.0), TypeError, "page_size must be a positive int, got float"),
    ("kv_indptr_float", (index([0, 1]).double(), index([1]), 16), ValueError, "kv_indptr must be a 1-D"),
    ("kv_indptr_tuple", ((0, 1), index([1]), 16), TypeError, "kv_indptr must be a 1-D"),
    ("kv_last_page_len_2d", (index([0, 1]), index([[1]]), 16), ValueError, "kv_last_page_len must be a 1-D"),
    (
        "kv_last_page_len_uint8",
        (index([0, 1]), index([1]).to(torch.uint8), 16),
        ValueError,
        "kv_last_page_len must be a 1-D",
    ),
    (
        "length_mismatch",
        (index([0, 1, 2]), index([1]), 16),
        ValueError,
        r"kv_last_page_len must have len\(kv_indptr\) - 1 = 2 entries, got 1",
    ),
]


@pytest.mark.parametrize(
    "args,error,message", [c[1:] for c in SEQ_LENS_METADATA], ids=[c[0] for c in SEQ_LENS_METADATA]
)
def test_seq_lens_metadata(args, error, message):
    with pytest.raises(error, match="^nvfp4kv.get_seq_lens: " + message):
        nvfp4kv.get_seq_lens(*args)


# ---------------------------------------------------------------- dequantize_paged_kv_cache

NUM_PAGES, PAGE_SIZE, HEADS, HEAD_DIM = 4, 4, 2, 32


def small_cache(device="cpu", layout="NHD"):
    inner = (PAGE_SIZE, HEADS) if layout == "NHD" else (HEADS, PAGE_SIZE)
    g = torch.Generator().manual_seed(7)
    return torch.randint(0, 256, (NUM_PAGES, 2, *inner, HEAD_DIM // 2), dtype=torch.uint8, generator=g).to(device)


def small_cache_sf(device="cpu", layout="NHD"):
    inner = (PAGE_SIZE, HEADS) if layout == "NHD" else (HEADS, PAGE_SIZE)
    g = torch.Generator().manual_seed(8)
    sf = torch.randint(0, 0x7F, (NUM_PAGES, 2, *inner, HEAD_DIM // 16), dtype=torch.uint8, generator=g)
    return sf.view(torch.float8_e4m3fn).to(device)


def page_table(kv_indices, kv_indptr, kv_last_page_len, device="cpu", dtype=torch.int64):
    return tuple(torch.tensor(v, dtype=dtype, device=device) for v in (kv_indices, kv_indptr, kv_last_page_len))


# (id, kv_indices, kv_indptr, kv_last_page_len, dtypes the values fit, the start of the message)
BAD_PAGE_TABLES = [
    (
        "negative_last_page_len",
        [0, 1],
        [0, 1, 2],
        [-3, 4],
        INDEX_DTYPES,
        r"kv_last_page_len\[0\] must be in \[1, page_size = 4\] for a request with pages, got -3$",
    ),
    (
        "last_page_len_zero_with_pages",
        [0, 1],
        [0, 1, 2],
        [4, 0],
        INDEX_DTYPES,
        r"kv_last_page_len\[1\] must be in \[1, page_size = 4\] for a request with pages, got 0$",
    ),
    (
        "last_page_len_beyond_page_size",
        [0, 1],
        [0, 1, 2],
        [5, 1],
        INDEX_DTYPES,
        r"kv_last_page_len\[0\] must be in \[1, page_size = 4\] for a request with pages, got 5$",
    ),
    (
        "last_page_len_int32_max",
        [0, 1],
        [0, 1, 2],
        [1, I32_MAX],
        INDEX_DTYPES,
        rf"kv_last_page_len\[1\] must be in \[1, page_size = 4\] for a request with pages, got {I32_MAX}$",
    ),
    (
        "last_page_len_int64_min",
        [0, 1],
        [0, 1, 2],
        [I64_MIN, 1],
        [torch.int64],
        rf"kv_last_page_len\[0\] must be in \[1, page_size = 4\] for a request with pages, got {I64_MIN}$",
    ),
    (
        "last_page_len_without_pages",
        [0, 1],
        [0, 1, 1, 2],
        [4, 2, 4],
        INDEX_DTYPES,
        r"kv_last_page_len\[1\] must be 0 for a request without pages, got 2$",
    ),
    ("indptr_negative_start", [0, 1], [-1, 1, 2], [4, 4], INDEX_DTYPES, r"kv_indptr\[0\] must be >= 0, got -1$"),
    (
        "indptr_int32_min_start",
        [0, 1],
        [I32_MIN, 1, 2],
        [4, 4],
        INDEX_DTYPES,
        rf"kv_indptr\[0\] must be >= 0, got {I32_MIN}$",
    ),
    (
        "indptr_int64_min_start",
        [0, 1],
        [I64_MIN, 1, 2],
        [4, 4],
        [torch.int64],
        rf"kv_indptr\[0\] must be >= 0, got {I64_MIN}$",
    ),
    (
        "indptr_decreasing",
        [0, 1, 2],
        [0, 2, 1, 3],
        [4, 4, 4],
        INDEX_DTYPES,
        r"kv_indptr must be non-decreasing, got kv_indptr\[2\] = 1 after kv_indptr\[1\] = 2",
    ),
    (
        "indptr_past_indices",
        [0, 1],
        [0, 1, 3],
        [4, 4],
        INDEX_DTYPES,
        r"kv_indptr\[-1\] must be <= len\(kv_indices\) = 2, got 3",
    ),
    ("indptr_int32_max_end", [0, 1], [0, 1, I32_MAX], [4, 4], INDEX_DTYPES, r"kv_indptr\[-1\] must be <= len"),
    (
        "indptr_int64_extremes",
        [0, 1],
        [0, I64_MAX, I64_MIN],
        [4, 4],
        [torch.int64],
        r"kv_indptr must be non-decreasing, got kv_indptr\[2\]",
    ),
    ("indptr_int64_max_end", [0, 1], [0, 1, I64_MAX], [4, 4], [torch.int64], r"kv_indptr\[-1\] must be <= len"),
    (
        "page_id_minus_one",
        [0, -1],
        [0, 1, 2],
        [4, 4],
        INDEX_DTYPES,
        r"kv_indices\[1\] must be a page id in \[0, max_num_pages = 4\), got -1",
    ),
    (
        "page_id_max_num_pages",
        [NUM_PAGES, 0],
        [0, 1, 2],
        [4, 4],
        INDEX_DTYPES,
        r"kv_indices\[0\] must be a page id in \[0, max_num_pages = 4\), got 4",
    ),
    (
        "page_id_int32_max",
        [0, 1, I32_MAX],
        [0, 1, 3],
        [4, 4],
        INDEX_DTYPES,
        rf"kv_indices\[2\] must be a page id in \[0, max_num_pages = 4\), got {I32_MAX}",
    ),
    ("page_id_int32_min", [I32_MIN], [0, 1], [4], INDEX_DTYPES, r"kv_indices\[0\] must be a page id"),
    ("page_id_int64_min", [0, I64_MIN], [0, 2], [4], [torch.int64], r"kv_indices\[1\] must be a page id"),
    ("page_id_int64_max", [I64_MAX, 1], [0, 1, 2], [1, 1], [torch.int64], r"kv_indices\[0\] must be a page id"),
    (
        "page_id_bad_after_offset",
        [-1, 3, 9],
        [1, 2, 3],
        [4, 4],
        INDEX_DTYPES,
        r"kv_indices\[2\] must be a page id in \[0, max_num_pages = 4\), got 9",
    ),
]


DEQUANTIZE_CASE = """
import re
table = page_table({!r}, {!r}, {!r}, {device!r}, {dtype})
try:
    nvfp4kv.dequantize_paged_kv_cache(small_cache({device!r}), small_cache_sf({device!r}), *table, 1.0, 1.0)
except ValueError as e:
    assert re.match("nvfp4kv.dequantize_paged_kv_cache: " + {!r}, str(e)), str(e)
else:
    raise AssertionError("no ValueError")
"""

for name, kv_indices, kv_indptr, kv_last_page_len, dtypes, message in BAD_PAGE_TABLES:
    for dtype in dtypes:
        ISOLATED_CASES[f"page_table_{name}_{dtype_name(dtype)}"] = (
            lambda device, args=(kv_indices, kv_indptr, kv_last_page_len, message), dtype=dtype: DEQUANTIZE_CASE.format(
                *args, device=device, dtype=dtype
            )
        )


@pytest.mark.parametrize("device", DEVICES)
def test_dequantize_reads_an_unused_tail_and_empty_requests(device):
    """Page ids outside kv_indptr's range are not read (they may be anything); requests without pages
    give no tokens; a page table of no tokens gives empty K and V."""
    cache, cache_sf = small_cache(device), small_cache_sf(device)
    table = page_table([-1, 2, 0, I32_MAX], [1, 1, 3, 3], [0, 3, 0], device)
    k, v = nvfp4kv.dequantize_paged_kv_cache(cache, cache_sf, *table, 1.0, 1.0, out_dtype=torch.float32)
    expected = [
        nvfp4kv.dequantize(c[[2, 2, 2, 2, 0, 0, 0]], s[[2, 2, 2, 2, 0, 0, 0]], 1.0)[
            torch.arange(7), [0, 1, 2, 3, 0, 1, 2]
        ]
        for c, s in ((cache[:, 0], cache_sf[:, 0]), (cache[:, 1], cache_sf[:, 1]))
    ]
    assert k.shape == (7, HEADS, HEAD_DIM)
    torch.testing.assert_close(k, expected[0], rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(v, expected[1], rtol=0, atol=0, equal_nan=True)
    k, v = nvfp4kv.dequantize_paged_kv_cache(cache, cache_sf, *page_table([], [0, 0], [0], device), 1.0, 1.0)
    assert k.shape == v.shape == (0, HEADS, HEAD_DIM) and k.dtype == torch.bfloat16


def dequantize_args(**changes):
    """A valid dequantize_paged_kv_cache call's arguments (two requests of 5 and 4 tokens) with changes."""
    kv_indices, kv_indptr, kv_last_page_len = page_table([3, 0, 2], [0, 2, 3], [1, 4])
    args = dict(
        paged_kv_cache=small_cache(),
        kv_cache_sf=small_cache_sf(),
        kv_indices=kv_indices,
        kv_indptr=kv_indptr,
        kv_last_page_len=kv_last_page_len,
        k_scale=0.5,
        v_scale=0.25,
        kv_layout="NHD",
        out_dtype=torch.float32,
        v_sf_layout="linear",
    )
    args.update(changes)
    return args


def halves(t):
    return t[:, 0], t[:, 1]


SCALE_BAD = [
    (True, TypeError, "must be a float or a one-element float32 tensor, got bool"),
    ("1.0", TypeError, "must be a float or a one-element float32 tensor, got str"),
    (None, TypeError, "must be a float or a one-element float32 tensor, got NoneType"),
    (0.0, ValueError, "must be a positive finite global decode scale in float32, got 0.0"),
    (0, ValueError, "must be a positive finite global decode scale in float32, got 0"),
    (-1.0, ValueError, "must be a positive finite global decode scale in float32, got -1.0"),
    (math.nan, ValueError, "must be a positive finite global decode scale in float32, got nan"),
    (math.inf, ValueError, "must be a positive finite global decode scale in float32, got inf"),
    (1e39, ValueError, "must be a positive finite global decode scale in float32"),  # inf in float32
    (1e-46, ValueError, "must be a positive finite global decode scale in float32"),  # 0 in float32
    (
        torch.full([HEAD_DIM], 0.5),
        ValueError,
        r"as a tensor must be a one-element float32 tensor on "
        r"paged_kv_cache's device \(cpu\), got dtype float32, shape "
        rf"\[{HEAD_DIM}\]",
    ),
    (torch.tensor([0.5], dtype=torch.float64), ValueError, "as a tensor must be a one-element float32"),
    (torch.tensor([], dtype=torch.float32), ValueError, "as a tensor must be a one-element float32"),
]

DEQUANTIZE_METADATA = [
    (
        "cache_float8",
        dict(paged_kv_cache=small_cache().view(torch.float8_e4m3fn)),
        ValueError,
        "paged_kv_cache must have dtype uint8, got float8_e4m3fn",
    ),
    (
        "cache_half_dtype",
        dict(paged_kv_cache=(small_cache()[:, 0], small_cache()[:, 1].view(torch.int8))),
        ValueError,
        r"paged_kv_cache\[1\] must have dtype uint8, got int8",
    ),
    (
        "cache_half_not_a_tensor",
        dict(paged_kv_cache=(small_cache()[:, 0], 3)),
        TypeError,
        r"paged_kv_cache\[1\] must be a torch.Tensor, got int",
    ),
    (
        "cache_4d_stacked",
        dict(paged_kv_cache=small_cache()[:, 0]),
        ValueError,
        r"paged_kv_cache as one tensor must be 5-D with K/V on dim 1 \(\[max_num_pages, 2, ...\]\), got shape "
        r"\[4, 4, 2, 16\]",
    ),
    (
        "cache_three_on_dim_1",
        dict(paged_kv_cache=small_cache().repeat(1, 2, 1, 1, 1)[:, :3]),
        ValueError,
        "paged_kv_cache as one tensor must be 5-D",
    ),
    (
        "cache_half_3d",
        dict(paged_kv_cache=(small_cache()[:, 0, 0], small_cache()[:, 1, 0])),
        ValueError,
        r"paged_kv_cache\[0\] must be a 4-D tensor, got shape \[4, 2, 16\]",
    ),
    (
        "cache_head_dim_not_multiple_of_16",
        dict(paged_kv_cache=small_cache()[..., :12], kv_cache_sf=small_cache_sf()[..., :1]),
        ValueError,
        "paged_kv_cache must have a last dim head_dim/2 that is a multiple of 8, got shape",
    ),
    (
        "cache_no_entries",
        dict(paged_kv_cache=small_cache()[:, :, :0], kv_cache_sf=small_cache_sf()[:, :, :0]),
        ValueError,
        "paged_kv_cache must have page_size >= 1",
    ),
    (
        "v_cache_other_shape",
        dict(paged_kv_cache=(small_cache()[:, 0], small_cache()[:3, 1])),
        ValueError,
        r"paged_kv_cache\[1\] must have shape \[max_num_pages, page_size, num_kv_heads, head_dim/2\] = \[4, 4, 2, 16\] "
        r"for kv_layout NHD, got \[3, 4, 2, 16\]",
    ),
    (
        "sf_uint8",
        dict(kv_cache_sf=small_cache_sf().view(torch.uint8)),
        ValueError,
        "kv_cache_sf must have dtype float8_e4m3fn, got uint8",
    ),
    (
        "sf_head_dim",
        dict(kv_cache_sf=small_cache_sf()[..., :1]),
        ValueError,
        r"kv_cache_sf must have shape \[max_num_pages, page_size, num_kv_heads, head_dim/16\] = \[4, 4, 2, 2\] for "
        r"kv_layout NHD, got \[4, 4, 2, 1\]",
    ),
    ("sf_pages", dict(kv_cache_sf=halves(small_cache_sf()[:2])), ValueError, r"kv_cache_sf\[0\] must have shape"),
    (
        "sf_wrong_layout",
        dict(kv_cache_sf=small_cache_sf(layout="HND")),
        ValueError,
        r"kv_cache_sf must have shape .* = \[4, 4, 2, 2\] for kv_layout NHD, got \[4, 2, 4, 2\]",
    ),
    ("kv_layout_int", dict(kv_layout=0), TypeError, "kv_layout must be a str, got int"),
    ("kv_layout_name", dict(kv_layout="NDH"), ValueError, 'kv_layout must be "NHD" or "HND", got "NDH"'),
    (
        "v_sf_layout_name",
        dict(v_sf_layout="interleaved"),
        ValueError,
        'v_sf_layout must be "linear" or "trtllm", got "interleaved"',
    ),
    ("v_sf_layout_none", dict(v_sf_layout=None), TypeError, "v_sf_layout must be a str"),
    (
        "v_sf_layout_trtllm_tiles",
        dict(v_sf_layout="trtllm"),
        ValueError,
        r'v_sf_layout "trtllm" needs page_size % 4 == 0 and head_dim % 64 == 0, got page_size 4 and head_dim 32',
    ),
    (
        "out_dtype_int",
        dict(out_dtype=torch.int32),
        ValueError,
        "out_dtype must be a floating-point torch.dtype, got torch.int32",
    ),
    (
        "out_dtype_str",
        dict(out_dtype="bfloat16"),
        TypeError,
        "out_dtype must be a floating-point torch.dtype, got 'bfloat16'",
    ),
    ("kv_indices_float", dict(kv_indices=index([3, 0, 2]).float()), ValueError, "kv_indices must be a 1-D int32"),
    ("kv_indices_list", dict(kv_indices=[3, 0, 2]), TypeError, "kv_indices must be a 1-D int32"),
    ("kv_indptr_2d", dict(kv_indptr=index([[0, 2, 3]])), ValueError, "kv_indptr must be a 1-D int32"),
    (
        "kv_last_page_len_short",
        dict(kv_last_page_len=index([1])),
        ValueError,
        r"kv_last_page_len must have len\(kv_indptr\) - 1 = 2 entries, got 1",
    ),
] + [
    (f"{name}_{i}", {name: bad}, error, f"{name} {message}")
    for name in ("k_scale", "v_scale")
    for i, (bad, error, message) in enumerate(SCALE_BAD)
]


@pytest.mark.parametrize(
    "changes,error,message", [c[1:] for c in DEQUANTIZE_METADATA], ids=[c[0] for c in DEQUANTIZE_METADATA]
)
def test_dequantize_metadata(changes, error, message):
    with pytest.raises(error, match="^nvfp4kv.dequantize_paged_kv_cache: " + message) as raised:
        nvfp4kv.dequantize_paged_kv_cache(**dequantize_args(**changes))
    assert not any(inner in str(raised.value) for inner in ("packed", "scales", "global_scale", " src"))


def test_dequantize_refuses_a_cache_that_is_not_a_pair():
    with pytest.raises(
        TypeError,
        match=r"kv_cache_sf must be a tensor or a \(K, V\) tuple of two tensors, got list "
        r"of length 1",
    ):
        nvfp4kv.dequantize_paged_kv_cache(**dequantize_args(kv_cache_sf=[small_cache_sf()]))


def test_dequantize_valid_arguments_and_scales():
    """The base call of test_dequantize_metadata is valid, and a one-element scale tensor of any shape
    multiplies like the float."""
    k, v = nvfp4kv.dequantize_paged_kv_cache(**dequantize_args())
    assert k.shape == v.shape == (9, HEADS, HEAD_DIM)
    for scale in (torch.tensor(0.5), torch.tensor([[0.5]])):
        k2, _ = nvfp4kv.dequantize_paged_kv_cache(**dequantize_args(k_scale=scale))
        assert k2.shape == k.shape
        torch.testing.assert_close(k2, k, rtol=0, atol=0, equal_nan=True)
    k3, _ = nvfp4kv.dequantize_paged_kv_cache(**dequantize_args(k_scale=1, paged_kv_cache=halves(small_cache())))
    torch.testing.assert_close(k3, 2 * k, rtol=0, atol=0, equal_nan=True)


# ---------------------------------------------------------------- convert_v_scale_layout


def v_scales(shape=(3, 8, 2, 8)):
    return torch.zeros(shape, dtype=torch.uint8).view(torch.float8_e4m3fn)


CONVERT_METADATA = [
    ("v_sf_list", dict(v_sf=[[1]]), TypeError, "v_sf must be a 4-D float8_e4m3fn or uint8 tensor, got list"),
    (
        "v_sf_float32",
        dict(v_sf=torch.zeros(3, 8, 2, 8)),
        ValueError,
        r"v_sf must be a 4-D float8_e4m3fn or uint8 tensor, got dtype float32, shape \[3, 8, 2, 8\]",
    ),
    ("v_sf_3d", dict(v_sf=v_scales((8, 2, 8))), ValueError, r"v_sf must be a 4-D .*, shape \[8, 2, 8\]"),
    ("src_int", dict(src=1), TypeError, "src must be a str, got int"),
    ("src_name", dict(src="swizzled"), ValueError, 'src must be "linear" or "trtllm", got "swizzled"'),
    ("dst_none", dict(dst=None), TypeError, "dst must be a str, got NoneType"),
    ("dst_name", dict(dst="TRTLLM"), ValueError, 'dst must be "linear" or "trtllm", got "TRTLLM"'),
    ("kv_layout_bytes", dict(kv_layout=b"NHD"), TypeError, "kv_layout must be a str, got bytes"),
    ("kv_layout_name", dict(kv_layout="nhd"), ValueError, 'kv_layout must be "NHD" or "HND", got "nhd"'),
    ("tiles", dict(v_sf=v_scales((3, 6, 2, 8))), ValueError, "the trtllm layout needs page_size % 4 == 0"),
    ("out_not_a_tensor", dict(out=[0]), TypeError, "out must be a tensor matching v_sf, got list"),
    ("out_shape", dict(out=v_scales((3, 8, 2, 4))), ValueError, r"out must match v_sf \(\[3, 8, 2, 8\]"),
    ("out_dtype", dict(out=v_scales().view(torch.uint8)), ValueError, "out must match v_sf"),
]


@pytest.mark.parametrize(
    "changes,error,message", [c[1:] for c in CONVERT_METADATA], ids=[c[0] for c in CONVERT_METADATA]
)
def test_convert_v_scale_layout_metadata(changes, error, message):
    args = dict(v_sf=v_scales(), src="linear", dst="trtllm", kv_layout="NHD", out=None)
    args.update(changes)
    with pytest.raises(error, match="^nvfp4kv.convert_v_scale_layout: " + message):
        nvfp4kv.convert_v_scale_layout(**args)


def test_convert_v_scale_layout_takes_uint8():
    raw = torch.arange(3 * 8 * 2 * 8, dtype=torch.int64).remainder(127).to(torch.uint8).reshape(3, 8, 2, 8)
    converted = nvfp4kv.convert_v_scale_layout(raw)
    assert converted.dtype == torch.uint8
    assert torch.equal(converted, nvfp4kv.convert_v_scale_layout(raw.view(torch.float8_e4m3fn)).view(torch.uint8))


# ---------------------------------------------------------------- e2m1_and_ufp8sf_scale_to_float


def e2m1_args(**changes):
    args = dict(
        e2m1_tensor=torch.zeros(2, 8, dtype=torch.uint8),
        ufp8_scale_tensor=torch.zeros(2, 1, dtype=torch.uint8),
        global_scale_tensor=torch.tensor([1.0]),
        sf_vec_size=16,
        ufp8_type=1,
        is_sf_swizzled_layout=False,
    )
    args.update(changes)
    return args


E2M1_METADATA = [
    ("e2m1_list", dict(e2m1_tensor=[[0]]), TypeError, "e2m1_tensor must be a 2-D uint8 tensor"),
    (
        "e2m1_float",
        dict(e2m1_tensor=torch.zeros(2, 8)),
        ValueError,
        r"e2m1_tensor must be a 2-D uint8 tensor \[M, K/2\] with K/2 a multiple of 8, "
        r"got dtype float32, shape \[2, 8\]",
    ),
    ("e2m1_1d", dict(e2m1_tensor=torch.zeros(16, dtype=torch.uint8)), ValueError, "e2m1_tensor must be a 2-D uint8"),
    (
        "e2m1_half_k_4",
        dict(e2m1_tensor=torch.zeros(2, 4, dtype=torch.uint8)),
        ValueError,
        r"e2m1_tensor must be a 2-D uint8 tensor .*, got dtype uint8, shape \[2, 4\]",
    ),
    ("scales_none", dict(ufp8_scale_tensor=None), TypeError, "ufp8_scale_tensor must be a uint8 or float8_e4m3fn"),
    (
        "scales_float32",
        dict(ufp8_scale_tensor=torch.zeros(2, 1)),
        ValueError,
        "ufp8_scale_tensor must be a uint8 or float8_e4m3fn tensor, got dtype float32",
    ),
    (
        "scales_count",
        dict(ufp8_scale_tensor=torch.zeros(3, dtype=torch.uint8)),
        ValueError,
        r"ufp8_scale_tensor must hold M \* K/16 = 2 scales, got 3",
    ),
    (
        "global_float",
        dict(global_scale_tensor=1.0),
        TypeError,
        "global_scale_tensor must be a one-element float32 tensor, got float",
    ),
    (
        "global_two",
        dict(global_scale_tensor=torch.tensor([1.0, 2.0])),
        ValueError,
        r"global_scale_tensor must be a one-element float32 tensor, got dtype float32, shape \[2\]",
    ),
    ("global_empty", dict(global_scale_tensor=torch.tensor([])), ValueError, "global_scale_tensor must be a one"),
    (
        "global_float64",
        dict(global_scale_tensor=torch.tensor([1.0], dtype=torch.float64)),
        ValueError,
        "global_scale_tensor must be a one-element float32 tensor, got dtype float64",
    ),
]


@pytest.mark.parametrize("changes,error,message", [c[1:] for c in E2M1_METADATA], ids=[c[0] for c in E2M1_METADATA])
def test_e2m1_and_ufp8sf_scale_to_float_metadata(changes, error, message):
    with pytest.raises(error, match="^nvfp4kv.fp4_quantization.e2m1_and_ufp8sf_scale_to_float: " + message) as raised:
        e2m1_and_ufp8sf_scale_to_float(**e2m1_args(**changes))
    assert "packed" not in str(raised.value) and "scales must" not in str(raised.value)


@pytest.mark.parametrize("device", DEVICES)
def test_e2m1_and_ufp8sf_scale_to_float_scalar_shapes(device):
    """A 0-d or [1, 1] global scale multiplies like [1]; the output keeps the shape [M, K]."""
    e2m1 = torch.full((2, 8), 0x22, dtype=torch.uint8, device=device)  # every code 1.0
    sf = torch.full((2,), 0x38, dtype=torch.uint8, device=device)  # 1.0
    for scale in (torch.tensor(0.5), torch.tensor([[0.5]]), torch.tensor([0.5], device=device)):
        out = e2m1_and_ufp8sf_scale_to_float(e2m1, sf, scale, 16, 1, False)
        assert out.shape == (2, 16) and out.device.type == device and bool((out == 0.5).all())


# ---------------------------------------------------------------- global_scale_from_amax

TINY = 2.0**-126
FLOAT32_MAX = 3.4028234663852886e38


@pytest.mark.parametrize(
    "amax,expected",
    [
        (2688.0, 1.0),
        (2688, 1.0),
        (1.0, 1.0 / 2688),
        (0.0, 1.0),
        (0, 1.0),
        (1e-300, TINY),
        (5e-324, TINY),
        (TINY, TINY),
        (1e40, 1e40 / 2688),
        (1e300, FLOAT32_MAX),
    ],
)
def test_global_scale_from_float_amax(amax, expected):
    scale = nvfp4kv.global_scale_from_amax(amax)
    assert type(scale) is float and scale == expected


@pytest.mark.parametrize("amax", [math.nan, math.inf, -math.inf, -1.0, -1, -1e-300])
def test_global_scale_from_bad_float_amax(amax):
    with pytest.raises(ValueError, match="^nvfp4kv.global_scale_from_amax: amax must be a finite, non-negative number"):
        nvfp4kv.global_scale_from_amax(amax)


@pytest.mark.parametrize("amax", [True, False, "1.0", None, torch.tensor(True)])
def test_global_scale_from_amax_refuses_other_types(amax):
    with pytest.raises(TypeError, match="^nvfp4kv.global_scale_from_amax: amax must be"):
        nvfp4kv.global_scale_from_amax(amax)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_global_scale_from_tensor_amax(device, dtype):
    amax = torch.tensor([2688.0, 0.0, -1.0, math.nan, math.inf, -math.inf, 1e-40, 26.88], dtype=dtype, device=device)
    scale = nvfp4kv.global_scale_from_amax(amax)
    assert scale.dtype == torch.float32 and scale.device == amax.device and scale.shape == amax.shape
    expected = torch.tensor([1.0, 1.0, 1.0, 1.0, 1.0, 1.0, TINY, 0.0], dtype=torch.float32)
    expected[-1] = amax[-1].cpu().float() / 2688
    assert torch.equal(scale.cpu(), expected), scale
    assert float(nvfp4kv.global_scale_from_amax(torch.tensor(2688.0, dtype=dtype, device=device))) == 1.0


def test_global_scale_from_tensor_amax_under_torch_compile():
    compiled = torch.compile(nvfp4kv.global_scale_from_amax, fullgraph=True)
    amax = torch.tensor([2688.0, 0.0, math.nan, 1e-40, 1.0])
    assert torch.equal(compiled(amax), nvfp4kv.global_scale_from_amax(amax))


# ---------------------------------------------------------------- the cases that used to crash


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case_id", list(ISOLATED_CASES))
def test_isolated_case(case_id, device):
    """rows_*: get_batch_indices_positions on bad index data; page_table_*: dequantize_paged_kv_cache on
    a bad page table (a ValueError naming the first bad entry)."""
    if ISOLATED_CASES[case_id](device) is None:
        pytest.skip(f"not a case on {device}")
    result = isolated_results(device)[case_id]
    assert result == "OK", f"{case_id} on {device}:\n{result}"
