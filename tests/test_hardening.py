"""Careless and hostile calls of the append API: Python types, every dtype, size-1 strides, errors
through torch.compile and TorchScript, debug mode (compiled too, duplicate slots)."""

import dataclasses

import numpy as np
import pytest
import torch
from conftest import compiled_error

import nvfp4kv

from append_cases import cache_bytes, make_append_case

APPEND = nvfp4kv.nvfp4_quantize_append_paged_kv_cache


def small_case(device="cpu", **overrides):
    options = dict(num_heads=2, head_dim=32, page_size=4, batch_size=3, seed=5)
    options.update(overrides)
    case = make_append_case(**options)
    # Separate allocations: the compiled calls below refuse caches sharing a storage.
    case = case.with_caches(tuple(t.clone() for t in case.paged_kv_cache), tuple(t.clone() for t in case.kv_cache_sf))
    return case.to(device)


@pytest.mark.parametrize(
    "argument,value",
    [
        ("k_scale", None),
        ("k_scale", "0.1"),
        ("k_scale", np.array([0.1])),
        ("k_scale", True),
        ("v_scale", [0.1]),
        ("kv_layout", None),
        ("kv_layout", 5),
        ("kv_layout", b"NHD"),
        ("append_key", [[1.0]]),
        ("kv_indices", np.zeros(3, dtype=np.int32)),
    ],
)
@pytest.mark.parametrize("tuple_caches", [True, False])
def test_wrong_python_type_raises_type_error_naming_the_argument(argument, value, tuple_caches):
    case = small_case()
    if not tuple_caches:  # the slow path: stacked caches
        case = case.with_caches(torch.stack(case.paged_kv_cache, 1), torch.stack(case.kv_cache_sf, 1))
    before = cache_bytes(case.paged_kv_cache)
    with pytest.raises(TypeError, match=rf"nvfp4kv.append_paged_kv_cache: {argument} must be a"):
        APPEND(*dataclasses.replace(case, **{argument: value}).args())
    assert torch.equal(cache_bytes(case.paged_kv_cache), before)


@pytest.mark.parametrize("argument,value", [("k_scale", None), ("kv_layout", 3), ("slot_mapping", [0, 1])])
def test_wrong_python_type_with_slot_mapping(argument, value):
    case = small_case()
    arguments = dict(
        append_key=case.append_key,
        append_value=case.append_value,
        slot_mapping=torch.arange(case.append_key.shape[0]),
        paged_kv_cache=case.paged_kv_cache,
        kv_cache_sf=case.kv_cache_sf,
        k_scale=0.01,
        v_scale=0.01,
        kv_layout="NHD",
    )
    arguments[argument] = value
    with pytest.raises(TypeError, match=rf"append_paged_kv_cache_with_slot_mapping: {argument} must be a"):
        nvfp4kv.nvfp4_quantize_append_paged_kv_cache_with_slot_mapping(**arguments)


def test_numpy_and_int_scales_are_read_as_floats():
    case, twin = small_case(), small_case()
    APPEND(*dataclasses.replace(case, k_scale=np.float32(0.25), v_scale=1).args())
    APPEND(*dataclasses.replace(twin, k_scale=0.25, v_scale=1.0).args())
    assert torch.equal(cache_bytes(case.paged_kv_cache), cache_bytes(twin.paged_kv_cache))


QUANTIZED = (torch.qint8, torch.quint8, torch.qint32, torch.quint4x2, torch.quint2x4)


def creatable_dtypes():
    names = []
    for name in dir(torch):
        dtype = getattr(torch, name)
        if isinstance(dtype, torch.dtype) and dtype not in (torch.float16, torch.bfloat16) and str(dtype) not in names:
            try:
                torch.empty(2, dtype=dtype)
            except Exception:  # noqa: BLE001 - dtypes torch cannot allocate on the CPU
                continue
            if dtype not in QUANTIZED:  # quantized tensors dispatch to torch's own QuantizedCPU key
                names.append(str(dtype))
    return sorted(names)


@pytest.mark.parametrize("dtype", creatable_dtypes())
def test_every_dtype_is_named_in_words_eager_and_compiled(dtype):
    dtype = getattr(torch, dtype.removeprefix("torch."))
    case = small_case()
    bad = dataclasses.replace(
        case,
        append_key=torch.zeros(case.append_key.shape, dtype=torch.uint8).view(dtype)
        if torch.empty(0, dtype=dtype).element_size() == 1
        else torch.empty(case.append_key.shape, dtype=dtype),
    )
    expected = f"append_key must have dtype float16 or bfloat16, got {str(dtype).removeprefix('torch.')}"
    with pytest.raises(ValueError) as eager:
        APPEND(*bad.args())
    assert str(eager.value).endswith(expected), str(eager.value)
    try:
        compiled = compiled_error(APPEND, *bad.args())
    except torch._dynamo.exc.InternalTorchDynamoError as error:  # e.g. torch 2.11 cannot trace bits8 inputs
        pytest.skip(f"torch.compile cannot trace {dtype} inputs: {error}".splitlines()[0])
    assert compiled == str(eager.value)


def test_strides_of_size_1_dims_do_not_matter(device):
    """head_dim 16: the scale caches' last dim has size 1, so its stride is arbitrary (here 7); one head
    and one-entry pages likewise."""
    case = small_case(device, head_dim=16, num_heads=1)
    plain = case.cloned()
    APPEND(*plain.args())
    odd = tuple(torch.as_strided(sf, sf.shape, (sf.stride(0), sf.stride(1), 13, 7)) for sf in case.kv_cache_sf)
    odd_data = tuple(torch.as_strided(c, c.shape, (c.stride(0), c.stride(1), 1000, 1)) for c in case.paged_kv_cache)
    strided = case.with_caches(odd_data, odd)
    APPEND(*strided.args())
    for got, want in zip(odd_data + odd, plain.paged_kv_cache + plain.kv_cache_sf):
        assert torch.equal(got.view(torch.uint8).cpu(), want.view(torch.uint8).cpu())


def test_compiled_bad_input_raises_the_eager_error(device):
    """Inductor-compiled code runs the op's checks: the same ValueError, nothing written."""
    torch._dynamo.reset()
    case = dataclasses.replace(small_case(device), k_scale=-1.0)
    before = cache_bytes(case.paged_kv_cache)
    with pytest.raises(ValueError) as eager:
        APPEND(*case.args())
    with pytest.raises(ValueError) as compiled:
        torch.compile(APPEND, fullgraph=True)(*case.args())
    assert str(compiled.value) == str(eager.value)
    assert torch.equal(cache_bytes(case.paged_kv_cache), before)


def test_torchscript_bad_input_carries_the_eager_message():
    @torch.jit.script
    def scripted(key, value, batch, positions, k, v, k_sf, v_sf, indices, indptr, last, k_scale: float):
        torch.ops.nvfp4kv.append_paged_kv_cache(
            key, value, batch, positions, k, v, k_sf, v_sf, indices, indptr, last, k_scale, 0.01, "NHD"
        )

    arguments = small_case().op_args()[:11]  # all but the scales and the layout
    with pytest.raises(ValueError) as eager:
        torch.ops.nvfp4kv.append_paged_kv_cache(*arguments, -1.0, 0.01, "NHD")
    with pytest.raises(RuntimeError) as traced:  # the TorchScript interpreter's error, carrying the message
        scripted(*arguments, -1.0)
    assert str(eager.value) in str(traced.value)


@pytest.fixture
def debug_mode():
    nvfp4kv.set_debug_checks(True)
    yield
    nvfp4kv.set_debug_checks(False)


def test_debug_mode_works_under_compile_fullgraph(device, debug_mode):
    torch._dynamo.reset()
    compiled = torch.compile(APPEND, fullgraph=True)
    case, eager = small_case(device), small_case(device)
    compiled(*case.args())
    APPEND(*eager.args())
    assert torch.equal(cache_bytes(case.paged_kv_cache), cache_bytes(eager.paged_kv_cache))
    bad = small_case(device)
    bad.batch_indices[1] = 7
    before = cache_bytes(bad.paged_kv_cache)
    with pytest.raises(ValueError, match=r"\(debug check\): row 1: batch index 7 is outside \[0, 3\)"):
        compiled(*bad.args())
    assert torch.equal(cache_bytes(bad.paged_kv_cache), before)


def test_debug_mode_reports_duplicate_slots(device, debug_mode):
    case = small_case(device, decode=True)
    case.batch_indices[2] = case.batch_indices[0]
    case.positions[2] = case.positions[0]
    with pytest.raises(ValueError, match=r"rows 0 and 2 both target page \d+, entry \d+"):
        APPEND(*case.args())
    slots = torch.tensor([5, 9, 5], device=device)
    with pytest.raises(ValueError, match=r"rows 0 and 2 both target page 1, entry 1"):
        nvfp4kv.nvfp4_quantize_append_paged_kv_cache_with_slot_mapping(
            case.append_key, case.append_value, slots, case.paged_kv_cache, case.kv_cache_sf, 0.01, 0.01
        )
