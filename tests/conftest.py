"""What the test modules share: the devices a test runs on, seeds from test parameters, the comparison
of whole caches, the op against the reference on one case, calls on fake tensors, page geometry and
misaligned copies, and the property tests' settings. Random input cases come from tests/append_cases.py.

A test with an argument named `device` runs once per device present: "cpu", and "cuda" where a GPU
and a build with the CUDA kernels exist (a test that parametrizes `device` itself keeps its own list).
This file imports the nvfp4kv package only when such a test is collected or a helper runs: the tests
of the reference oracle (tests/reference_source.py) run without the compiled library.
"""

from __future__ import annotations

import functools
import os
import zlib

import pytest
import torch
from hypothesis import HealthCheck, settings

from append_cases import cache_bytes

# The property tests' settings: NVFP4KV_FUZZ_EXAMPLES random cases per test (60 by default).
FUZZ = settings(max_examples=int(os.environ.get("NVFP4KV_FUZZ_EXAMPLES", "60")), deadline=None,
                suppress_health_check=[HealthCheck.too_slow], derandomize=False)  # fmt: skip


@functools.lru_cache(maxsize=None)
def devices() -> tuple:
    import nvfp4kv

    cuda = torch.cuda.is_available() and nvfp4kv.library.has_cuda_kernels()
    return ("cpu", "cuda") if cuda else ("cpu",)


def has_cuda() -> bool:
    """A CUDA GPU and a build with the CUDA kernels."""
    return "cuda" in devices()


def force_kernel_mode(mode: str) -> None:
    import nvfp4kv

    nvfp4kv.library.force_kernel_mode(mode)


@pytest.fixture
def forced_kernel_mode(request):
    """Forces the kernel mode given as the indirect parameter for one test, then restores "auto"."""
    force_kernel_mode(request.param)
    yield request.param
    force_kernel_mode("auto")


def pytest_generate_tests(metafunc):
    if "device" in metafunc.fixturenames and "device" not in _parametrized_names(metafunc):
        metafunc.parametrize("device", devices())


def _parametrized_names(metafunc) -> set:
    names = set()
    for mark in metafunc.definition.iter_markers(name="parametrize"):
        argnames = mark.args[0] if mark.args else mark.kwargs["argnames"]
        if isinstance(argnames, str):
            argnames = argnames.split(",")
        names.update(n.strip() for n in argnames)
    return names


def seed_of(*parameters) -> int:
    """A seed from a test's parameters, the same in every run (hash() of a str changes between processes)."""
    return zlib.crc32(repr(parameters).encode()) % 10000


def assert_same_caches(a, b, what: str = "") -> None:
    """Every byte of the storage behind both caches of two AppendCases is equal: a byte written in the
    wrong place, or not written, differs from the other side's poison or value."""
    for name in ("paged_kv_cache", "kv_cache_sf"):
        x, y = cache_bytes(getattr(a, name)), cache_bytes(getattr(b, name))
        assert torch.equal(x, y), f"{what} {name}: {int((x != y).sum())} of {x.numel()} bytes differ".lstrip()


def assert_append_matches(case, device: str, what: str = "", reference_on_cuda: bool = True, **options):
    """Appends a CPU case with the op on `device` and with the reference, each into its own copy of the
    caches, and compares every cache byte; on CUDA the CPU op's bytes too. reference_on_cuda=False
    leaves the reference out on CUDA, where the CPU op stands in for it (cases too large for the
    reference to be quick); on the CPU the reference is always run. Returns the case appended on `device`."""
    import nvfp4kv
    from nvfp4kv import reference

    ours = case.to(device)
    nvfp4kv.nvfp4_quantize_append_paged_kv_cache(*ours.args(), **options)
    if device != "cpu":
        on_cpu = case.cloned()
        nvfp4kv.nvfp4_quantize_append_paged_kv_cache(*on_cpu.args(), **options)
        torch.cuda.synchronize()
        assert_same_caches(ours, on_cpu, f"{what} {device} vs CPU:")
    if device == "cpu" or reference_on_cuda:
        theirs = case.cloned()
        reference.nvfp4_quantize_append_paged_kv_cache(*theirs.args(), **options)
        assert_same_caches(ours, theirs, f"{what} {device} vs reference:")
    return ours


def _separate(value):
    """A (K, V) tuple of two views of one storage as two separate copies (same strides): caches sharing
    a storage are refused under compile, whatever else is wrong."""
    if (
        isinstance(value, tuple)
        and len(value) == 2
        and all(isinstance(t, torch.Tensor) for t in value)
        and torch._C._is_alias_of(value[0], value[1])
    ):
        return tuple(torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device).copy_(t) for t in value)
    return value


def compiled_error(call, *args, separate_halves=True, **kwargs) -> str:
    """The error message of `call` compiled with torch.compile(fullgraph=True). The fakes check nothing
    but what tracing needs, so the op's own checks raise their ValueError when the compiled code runs
    (before the kernel writes); a refusal at trace time (caches sharing a storage) and torch's own refusal
    of an expanded cache come wrapped in a TorchDynamo exception."""
    torch._dynamo.reset()
    if separate_halves:
        args = [_separate(a) for a in args]
    compiled = torch.compile(call, fullgraph=True, backend="aot_eager")
    refusals = (ValueError, torch._dynamo.exc.TorchDynamoException)
    with pytest.raises(refusals) as error:
        compiled(*args, **kwargs)
    if isinstance(error.value, torch._dynamo.exc.InternalTorchDynamoError):
        raise error.value  # torch's compiler failed on its own, before any refusal
    return str(error.value)


def page_geometry(case) -> tuple:
    """(max_num_pages, page_size) of a case's caches, stacked or a (K, V) tuple, in either layout."""
    k = case.paged_kv_cache if isinstance(case.paged_kv_cache, torch.Tensor) else case.paged_kv_cache[0]
    entry_dim = (1 if case.kv_layout == "NHD" else 2) + (1 if k.dim() == 5 else 0)
    return k.shape[0], k.shape[entry_dim]


def misaligned_copy(t: torch.Tensor, offset_elements: int) -> torch.Tensor:
    """t copied into a fresh buffer at the given storage offset (a misaligned view of the same shape)."""
    flat = torch.empty(t.numel() + offset_elements, dtype=t.dtype, device=t.device)
    view = flat[offset_elements:].view(t.shape)
    view.copy_(t)
    return view


def assert_no_synchronisation_or_allocation(calls) -> None:
    """After one warm-up (first-call work of torch and of the library), three rounds of calls() on CUDA neither
    synchronise with the host (torch's sync debug mode raises) nor allocate device memory."""
    calls()
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
