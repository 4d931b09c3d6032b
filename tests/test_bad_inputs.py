"""Bad input gives a clear error before anything is written (SPEC section 3).

Each case breaks one thing in a valid call. The eager op must raise ValueError naming the argument
and leave every cache byte unchanged; the same call compiled must raise the very same message when
it runs (the op's checks are the only ones), or, for caches sharing a storage, be refused when traced.
"""

import dataclasses

import pytest
import torch
from conftest import compiled_error

import nvfp4kv

from append_cases import cache_bytes, make_append_case


def base_case(**overrides):
    """A valid case; tuple caches are separate allocations (not the halves of one tensor)."""
    options = dict(layout="NHD", head_dim=64, num_heads=4, page_size=8, batch_size=3, seed=1)
    options.update(overrides)
    case = make_append_case(**options)
    if isinstance(case.paged_kv_cache, tuple):
        case = case.with_caches(
            tuple(t.clone() for t in case.paged_kv_cache), tuple(t.clone() for t in case.kv_cache_sf)
        )
    return case


TORCH_BEFORE_2_13 = tuple(int(n) for n in torch.__version__.split("+")[0].split(".")[:2]) < (2, 13)


def shares_storage(case) -> bool:
    """Whether a cache shares its storage with another cache or argument (refused under compile)."""
    tensors = [
        t
        for value in case.args()
        for t in (value if isinstance(value, tuple) else (value,))
        if isinstance(t, torch.Tensor)
    ]
    caches = [
        t
        for value in (case.paged_kv_cache, case.kv_cache_sf)
        for t in (value if isinstance(value, tuple) else (value,))
    ]
    return any(torch._C._is_alias_of(c, t) for c in caches for t in tensors if t is not c)


def expanded(case) -> bool:
    """Whether a cache has a stride-0 dim of size > 1 (torch's compiler refuses to write it)."""
    caches = [
        t
        for value in (case.paged_kv_cache, case.kv_cache_sf)
        for t in (value if isinstance(value, tuple) else (value,))
    ]
    return any(size > 1 and stride == 0 for c in caches for size, stride in zip(c.shape, c.stride()))


def edit(**changes):
    """A mutation setting fields from functions of the valid case."""
    return lambda c: dataclasses.replace(c, **{k: f(c) for k, f in changes.items()})


def with_k(cache, new_k):
    return (new_k, cache[1])


def with_v(cache, new_v):
    return (cache[0], new_v)


# (id, mutation, the argument name the message must contain, base-case overrides)
CASES = [
    ("key_dtype_float32", edit(append_key=lambda c: c.append_key.float()), "append_key", {}),
    ("key_dtype_int", edit(append_key=lambda c: c.append_key.to(torch.int16)), "append_key", {}),
    ("value_dtype_mismatch", edit(append_value=lambda c: c.append_value.half()), "append_value", {}),
    ("key_rank_2", edit(append_key=lambda c: c.append_key.flatten(1)), "append_key", {}),
    ("key_rank_4", edit(append_key=lambda c: c.append_key[None]), "append_key", {}),
    ("value_heads_mismatch", edit(append_value=lambda c: c.append_value[:, :2]), "append_value", {}),
    ("value_nnz_mismatch", edit(append_value=lambda c: c.append_value[:-1]), "append_value", {}),
    (
        "head_dim_not_multiple_of_16",
        edit(
            append_key=lambda c: c.append_key[..., :40].contiguous(),
            append_value=lambda c: c.append_value[..., :40].contiguous(),
        ),
        "append_key",
        {},
    ),
    (
        "key_last_dim_strided",
        edit(append_key=lambda c: torch.repeat_interleave(c.append_key, 2, -1)[..., ::2]),
        "append_key",
        {},
    ),
    (
        "value_last_dim_strided",
        edit(append_value=lambda c: torch.repeat_interleave(c.append_value, 2, -1)[..., ::2]),
        "append_value",
        {},
    ),
    ("batch_indices_float", edit(batch_indices=lambda c: c.batch_indices.float()), "batch_indices", {}),
    ("positions_int16", edit(positions=lambda c: c.positions.to(torch.int16)), "positions", {}),
    ("batch_indices_2d", edit(batch_indices=lambda c: c.batch_indices[None]), "batch_indices", {}),
    ("batch_indices_nnz_mismatch", edit(batch_indices=lambda c: c.batch_indices[:-1]), "batch_indices", {}),
    ("positions_nnz_mismatch", edit(positions=lambda c: torch.cat([c.positions, c.positions[:1]])), "positions", {}),
    ("kv_indices_float", edit(kv_indices=lambda c: c.kv_indices.double()), "kv_indices", {}),
    ("kv_indptr_2d", edit(kv_indptr=lambda c: c.kv_indptr[None]), "kv_indptr", {}),
    ("kv_indptr_vs_batch_size", edit(kv_indptr=lambda c: c.kv_indptr[:-1]), "kv_indptr", {}),
    (
        "kv_last_page_len_dtype",
        edit(kv_last_page_len=lambda c: c.kv_last_page_len.to(torch.uint8)),
        "kv_last_page_len",
        {},
    ),
    (
        "k_cache_dtype",
        edit(paged_kv_cache=lambda c: with_k(c.paged_kv_cache, c.paged_kv_cache[0].view(torch.int8))),
        "paged_kv_cache[0]",
        {},
    ),
    (
        "v_cache_dtype",
        edit(paged_kv_cache=lambda c: with_v(c.paged_kv_cache, c.paged_kv_cache[1].view(torch.int8))),
        "paged_kv_cache[1]",
        {},
    ),
    (
        "sf_dtype_uint8",
        edit(kv_cache_sf=lambda c: with_k(c.kv_cache_sf, c.kv_cache_sf[0].view(torch.uint8))),
        "kv_cache_sf[0]",
        {},
    ),
    (
        "k_cache_rank_3",
        edit(paged_kv_cache=lambda c: with_k(c.paged_kv_cache, c.paged_kv_cache[0][0])),
        "paged_kv_cache[0]",
        {},
    ),
    (
        "k_cache_heads_mismatch",
        edit(paged_kv_cache=lambda c: with_k(c.paged_kv_cache, c.paged_kv_cache[0][:, :, :2])),
        "paged_kv_cache[0]",
        {},
    ),
    (
        "k_cache_width_mismatch",
        edit(paged_kv_cache=lambda c: with_k(c.paged_kv_cache, c.paged_kv_cache[0][..., :16])),
        "paged_kv_cache[0]",
        {},
    ),
    (
        "v_cache_pages_mismatch",
        edit(paged_kv_cache=lambda c: with_v(c.paged_kv_cache, c.paged_kv_cache[1][:-1])),
        "paged_kv_cache[1]",
        {},
    ),
    (
        "v_cache_page_size_mismatch",
        edit(paged_kv_cache=lambda c: with_v(c.paged_kv_cache, c.paged_kv_cache[1][:, :-1])),
        "paged_kv_cache[1]",
        {},
    ),
    (
        "sf_width_mismatch",
        edit(kv_cache_sf=lambda c: with_v(c.kv_cache_sf, c.kv_cache_sf[1][..., :2])),
        "kv_cache_sf[1]",
        {},
    ),
    (
        "sf_page_size_mismatch",
        edit(kv_cache_sf=lambda c: with_k(c.kv_cache_sf, c.kv_cache_sf[0][:, :-1])),
        "kv_cache_sf[0]",
        {},
    ),
    (
        "sf_pages_mismatch",
        edit(kv_cache_sf=lambda c: with_k(c.kv_cache_sf, c.kv_cache_sf[0][:-1])),
        "kv_cache_sf[0]",
        {},
    ),
    (
        "cache_last_dim_strided",
        edit(
            paged_kv_cache=lambda c: with_k(
                c.paged_kv_cache, torch.repeat_interleave(c.paged_kv_cache[0], 2, -1)[..., ::2]
            )
        ),
        "paged_kv_cache[0]",
        {},
    ),
    (
        "cache_page_size_zero",
        edit(
            paged_kv_cache=lambda c: tuple(t[:, :0] for t in c.paged_kv_cache),
            kv_cache_sf=lambda c: tuple(t[:, :0] for t in c.kv_cache_sf),
        ),
        "paged_kv_cache[0]",
        {},
    ),
    (
        "stacked_dim1_not_2",
        edit(paged_kv_cache=lambda c: torch.cat([c.paged_kv_cache, c.paged_kv_cache[:, :1]], 1)),
        "paged_kv_cache",
        {"stacked": True},
    ),
    ("stacked_rank_4", edit(kv_cache_sf=lambda c: c.kv_cache_sf[:, 0]), "kv_cache_sf", {"stacked": True}),
    (
        "stacked_dtype",
        edit(paged_kv_cache=lambda c: c.paged_kv_cache.view(torch.float8_e4m3fn)),
        "paged_kv_cache",
        {"stacked": True},
    ),
    (
        "stacked_heads_mismatch",
        edit(paged_kv_cache=lambda c: c.paged_kv_cache[:, :, :, :1]),
        "paged_kv_cache",
        {"stacked": True},
    ),
    ("hnd_cache_with_nhd_layout", edit(kv_layout=lambda c: "NHD"), "paged_kv_cache[0]", {"layout": "HND"}),
    ("layout_string", edit(kv_layout=lambda c: "NDH"), "kv_layout", {}),
    ("layout_lowercase", edit(kv_layout=lambda c: "nhd"), "kv_layout", {}),
    ("k_scale_zero", edit(k_scale=lambda c: 0.0), "k_scale", {}),
    ("k_scale_negative", edit(k_scale=lambda c: -1.0), "k_scale", {}),
    ("k_scale_underflows_fp32", edit(k_scale=lambda c: 1e-50), "k_scale", {}),
    ("v_scale_inf", edit(v_scale=lambda c: float("inf")), "v_scale", {}),
    ("v_scale_nan", edit(v_scale=lambda c: float("nan")), "v_scale", {}),
    ("v_scale_overflows_fp32", edit(v_scale=lambda c: 1e39), "v_scale", {}),
    # Aliasing: what the op writes must not overlap itself, each other or anything it reads.
    (
        "k_cache_is_v_cache",
        edit(paged_kv_cache=lambda c: (c.paged_kv_cache[0], c.paged_kv_cache[0])),
        "paged_kv_cache[1]",
        {},
    ),
    (
        "k_cache_overlaps_v_cache",
        edit(paged_kv_cache=lambda c: shifted_pair(c.paged_kv_cache)),
        "paged_kv_cache[1]",
        {},
    ),
    (
        "v_cache_expanded",
        edit(
            paged_kv_cache=lambda c: with_v(c.paged_kv_cache, c.paged_kv_cache[1][:1].expand(c.paged_kv_cache[1].shape))
        ),
        "paged_kv_cache[1]",
        {},
    ),
    (
        "stacked_dim1_expanded",
        edit(paged_kv_cache=lambda c: c.paged_kv_cache[:, :1].expand(c.paged_kv_cache.shape)),
        "paged_kv_cache",
        {"stacked": True},
    ),
    ("scales_overlap_data", lambda c: stored_in(c, "kv_cache_sf", 0, "paged_kv_cache", 0), "kv_cache_sf[0]", {}),
    ("key_inside_cache", lambda c: stored_in(c, "append_key", None, "paged_kv_cache", 1), "append_key", {}),
    ("kv_indices_inside_cache", lambda c: stored_in(c, "kv_indices", None, "paged_kv_cache", 0), "kv_indices", {}),
    ("positions_inside_scales", lambda c: stored_in(c, "positions", None, "kv_cache_sf", 1), "positions", {}),
]


def shifted_pair(cache):
    """K and V views of one storage, V starting half a page after K: they overlap."""
    k = torch.stack([cache[0], cache[1]])[0]
    shift = k.stride(0) // 2
    return k, k.view(-1)[shift:].as_strided(k.shape, k.stride())


def stored_in(case, field, index, cache_field, cache_index):
    """The case with `field` (or its element `index`) and cache `cache_field`[`cache_index`] moved into one
    buffer, the field's first 16 bytes over the cache's last 16: they overlap, every value as before."""
    caches = list(getattr(case, cache_field))
    value = getattr(case, field)
    tensor = value if index is None else value[index]
    cache = caches[cache_index].contiguous()
    cache_bytes_, tensor_bytes = cache.numel() * cache.element_size(), tensor.numel() * tensor.element_size()
    buffer = torch.empty(cache_bytes_ + tensor_bytes, dtype=torch.uint8)
    caches[cache_index] = buffer[:cache_bytes_].view(cache.dtype).view(cache.shape).copy_(cache)
    start = cache_bytes_ - 16
    moved = buffer[start : start + tensor_bytes].view(tensor.dtype).view(tensor.shape).copy_(tensor)
    if index is not None:
        moved = tuple(moved if i == index else v for i, v in enumerate(value))
    return dataclasses.replace(case, **{cache_field: tuple(caches), field: moved})


@pytest.mark.parametrize("mutate,argument,overrides", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_raises_named_error_and_writes_nothing(mutate, argument, overrides, device):
    case = mutate(base_case(**overrides)).to(device)
    before_data, before_sf = cache_bytes(case.paged_kv_cache), cache_bytes(case.kv_cache_sf)
    with pytest.raises(ValueError) as eager:
        nvfp4kv.nvfp4_quantize_append_paged_kv_cache(*case.args())
    message = str(eager.value)
    assert message.startswith("nvfp4kv.append_paged_kv_cache: "), message
    assert f" {argument} " in f" {message.split(': ', 1)[1]}", f"{argument!r} not named first in: {message}"
    assert ", got " in message, message
    assert torch.equal(cache_bytes(case.paged_kv_cache), before_data)
    assert torch.equal(cache_bytes(case.kv_cache_sf), before_sf)

    compiled = compiled_error(nvfp4kv.nvfp4_quantize_append_paged_kv_cache, *case.args(), separate_halves=False)
    if shares_storage(case):
        # torch < 2.13 refuses tensors of different dtypes sharing a storage itself, before the fakes run
        own_refusal = TORCH_BEFORE_2_13 and "does not yet handle" in compiled
        assert "shares its storage with" in compiled or own_refusal, compiled
    elif expanded(case):
        assert "refers to a single memory location" in compiled, compiled
    else:
        assert compiled == message
    assert torch.equal(cache_bytes(case.paged_kv_cache), before_data)


def test_device_mismatch_is_named():
    """A tensor on another device (meta stands in where no GPU exists) is rejected by name."""
    case = base_case()
    case.positions = case.positions.to("meta")
    before = cache_bytes(case.paged_kv_cache)
    with pytest.raises(ValueError, match=r"positions must be on the same device as append_key \(cpu\), got meta"):
        nvfp4kv.nvfp4_quantize_append_paged_kv_cache(*case.args())
    assert torch.equal(cache_bytes(case.paged_kv_cache), before)


def test_read_tensor_between_written_caches_is_accepted(device):
    """One buffer holding [K cache | kv_indices | V cache]: the index tensor lies between what the op writes
    (inside the span of the written tensors) but overlaps none of them, so the call runs and writes the bytes
    of separate allocations."""
    separate = base_case().to(device)
    k, v = separate.paged_kv_cache
    kv_indices = separate.kv_indices.clone()
    k_bytes, index_bytes = k.numel(), kv_indices.numel() * kv_indices.element_size()
    gap = -(-index_bytes // 16) * 16
    buffer = torch.full((k_bytes + gap + v.numel(),), 0x5A, dtype=torch.uint8, device=device)
    pooled_caches = (buffer[:k_bytes].view(k.shape).copy_(k), buffer[k_bytes + gap :].view(v.shape).copy_(v))
    indices = buffer[k_bytes : k_bytes + index_bytes].view(kv_indices.dtype).copy_(kv_indices)
    pooled = dataclasses.replace(separate.cloned(), paged_kv_cache=pooled_caches, kv_indices=indices)
    nvfp4kv.nvfp4_quantize_append_paged_kv_cache(*pooled.args())
    nvfp4kv.nvfp4_quantize_append_paged_kv_cache(*separate.args())
    for pooled_cache, separate_cache in zip(pooled.paged_kv_cache, separate.paged_kv_cache):
        assert torch.equal(pooled_cache, separate_cache)
    assert torch.equal(indices, kv_indices)
    assert bool((buffer[k_bytes + index_bytes : k_bytes + gap] == 0x5A).all())


@pytest.mark.parametrize("bad", [lambda c: (c[0],), lambda c: (c[0], c[1], c[1]), lambda c: "cache"])
def test_cache_structure_is_named(bad):
    case = base_case()
    with pytest.raises(TypeError, match="paged_kv_cache must be a tensor or a \\(K, V\\) tuple"):
        nvfp4kv.nvfp4_quantize_append_paged_kv_cache(
            *dataclasses.replace(case, paged_kv_cache=bad(case.paged_kv_cache)).args()
        )


DEQUANTIZE_CASES = [
    ("packed_dtype", lambda p, s: (p.view(torch.int8), s, 1.0), "packed"),
    ("scales_dtype", lambda p, s: (p, s.view(torch.uint8), 1.0), "scales"),
    ("packed_width", lambda p, s: (p[..., :12], s, 1.0), "packed"),
    ("scales_width", lambda p, s: (p, s[..., :1], 1.0), "scales"),
    ("leading_shape", lambda p, s: (p, s[:1], 1.0), "scales"),
    ("global_scale_zero", lambda p, s: (p, s, 0.0), "global_scale"),
    ("global_scale_nan", lambda p, s: (p, s, float("nan")), "global_scale"),
]


@pytest.mark.parametrize("mutate,argument", [c[1:] for c in DEQUANTIZE_CASES], ids=[c[0] for c in DEQUANTIZE_CASES])
def test_dequantize_bad_input(mutate, argument):
    packed = torch.randint(0, 256, (3, 32), dtype=torch.uint8)
    scales = torch.randint(0, 120, (3, 4), dtype=torch.uint8).view(torch.float8_e4m3fn)
    args = mutate(packed, scales)
    with pytest.raises(ValueError) as eager:
        nvfp4kv.dequantize(*args)
    message = str(eager.value)
    assert message.startswith(f"nvfp4kv.dequantize: {argument} "), message
    assert compiled_error(nvfp4kv.dequantize, *args) == message
