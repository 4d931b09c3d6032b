"""The benchmark cases and the input sets each case's samples walk."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Optional

import torch

import nvfp4kv
from nvfp4kv import reference

HEADS = 8
PAGE_SIZE = 16
DTYPE = torch.bfloat16


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
    in_chart: bool = False  # a point of the chart's kernel series (the base cases; variants: table only)
    chart_baseline: bool = False  # its pure-PyTorch rate is a point of the chart too
    kpe_dim: int = 0  # > 0: an MLA latent append, ckv_dim = head_dim (one head), kpe_dim RoPE values
    page_size: int = PAGE_SIZE
    q_heads: int = 0  # > 0: the fused RoPE + append, q_heads query heads (the unfused pipeline timed beside it)
    q_fp8: bool = False  # the fused RoPE case's Q goes out in FP8 E4M3

    @property
    def bytes_moved(self) -> int:
        """bf16 inputs read, packed data, scales (and MLA kpe bytes) written (index reads are not counted)."""
        if self.kpe_dim:
            c, r = self.head_dim, self.kpe_dim
            return self.nnz * (2 * (c + r) + c // 2 + c // 16 + r)
        values = self.nnz * self.heads * self.head_dim
        kv = 2 * (2 * values + values // 2 + values // 16)
        if self.q_heads:  # Q read, Q written (16-bit or FP8)
            q_values = self.nnz * self.q_heads * self.head_dim
            return kv + (2 + (1 if self.q_fp8 else 2)) * q_values
        return kv

    @property
    def requests(self) -> int:
        return self.nnz // self.tokens_per_request

    @property
    def pages_per_request(self) -> int:
        return max(1, math.ceil(self.tokens_per_request / self.page_size))

    @property
    def bytes_per_input_set(self) -> int:
        """bytes_moved plus the int32 index tensors of one input set."""
        pages = self.requests * self.pages_per_request
        return self.bytes_moved + 4 * (2 * self.nnz + pages + self.requests + 1)


def benchmark_cases() -> List[Case]:
    # The base cases, charted: decode (one token per request) and prefill (requests of 1024 tokens).
    charted = dict(in_chart=True)
    cases = [
        Case(f"decode nnz={n}", "decode", n, 128, "NHD", 1, chart_baseline=True, **charted)
        for n in (1, 8, 64, 256, 1024)
    ]
    for layout in ("NHD", "HND"):
        cases += [
            Case(
                f"prefill nnz={n} D=128 {layout}",
                "prefill",
                n,
                128,
                layout,
                1024,
                chart_baseline=layout == "NHD",
                **charted,
            )
            for n in (4096, 16384, 65536)
        ]
    cases += [Case(f"prefill nnz=16384 D={d} NHD", "prefill", 16384, d, "NHD", 1024, **charted) for d in (64, 256)]
    # The slot-mapping variant (same targets as the page-table op).
    cases += [
        Case(f"slots decode nnz={n}", "decode", n, 128, "NHD", 1, "slot_mapping", baseline=False) for n in (1, 64, 1024)
    ]
    cases += [
        Case(f"slots prefill nnz={n} D=128 NHD", "prefill", n, 128, "NHD", 1024, "slot_mapping", baseline=False)
        for n in (16384, 65536)
    ]
    # The optional formats: trtllm V scales (within 5% of linear), 4-over-6 (>= 80% of the ceiling).
    extra = dict(baseline=False)
    cases += [
        Case("linear decode nnz=64 HND", "decode", 64, 128, "HND", 1, **extra),
        Case("trtllm decode nnz=64 HND", "decode", 64, 128, "HND", 1, v_sf_layout="trtllm", **extra),
        Case("trtllm prefill nnz=65536 D=128 HND", "prefill", 65536, 128, "HND", 1024, v_sf_layout="trtllm", **extra),
        Case("4over6 prefill nnz=65536 D=128 NHD", "prefill", 65536, 128, "NHD", 1024, scale_search="4over6", **extra),
    ]
    # Per-layer scales kept on the device (serving engines): read by the kernel, no host value.
    cases += [
        Case(f"device-scale decode nnz={n}", "decode", n, 128, "NHD", 1, device_scales=True, **extra) for n in (1, 64)
    ]
    cases += [
        Case(
            "device-scale prefill nnz=65536 D=128 NHD", "prefill", 65536, 128, "NHD", 1024, device_scales=True, **extra
        )
    ]
    # One KV head per GPU (a tensor-parallel shard of a GQA model): fewer than 9 threads per row, so the
    # one-item kernel in its "oneshot" mode instead of the pair kernel.
    cases += [Case("1-head prefill nnz=65536 D=128 NHD", "prefill", 65536, 128, "NHD", 1024, heads=1, **extra)]
    # MLA latent rows (DeepSeek: ckv 512, kpe 64), pages of 64 and of 16 tokens.
    mla = dict(kpe_dim=64, heads=1, **extra)
    for page in (64, 16):
        cases += [Case(f"mla p{page} decode nnz={n}", "decode", n, 512, "NHD", 1, page_size=page, **mla)
                  for n in (1, 8, 64, 256, 1024)]  # fmt: skip
        cases += [Case(f"mla p{page} prefill nnz={n}", "prefill", n, 512, "NHD", 1024, page_size=page, **mla)
                  for n in (4096, 16384, 65536)]  # fmt: skip
    # The fused RoPE + append of a Llama-3-8B layer (Hq 32, Hkv 8, D 128, rotary dim 128, NeoX pairs), Q out in
    # bf16 and in FP8; the unfused pipeline (compiled RoPE, then the append) is timed beside each.
    rope = dict(q_heads=32, baseline=False)
    for fp8 in (False, True):
        q = "fp8 q" if fp8 else "bf16 q"
        cases += [Case(f"rope {q} decode nnz={n}", "decode", n, 128, "NHD", 1, q_fp8=fp8, **rope)
                  for n in (1, 8, 64, 256)]  # fmt: skip
        cases += [Case(f"rope {q} prefill nnz={n}", "prefill", n, 128, "NHD", 1024, q_fp8=fp8, **rope)
                  for n in (4096, 16384, 65536)]  # fmt: skip
    return cases


class MlaInputSets:
    """InputSets of an MLA case: `count` sets of ckv/kpe rows and page tables, each addressing its own pages
    of one shared set of latent caches."""

    def __init__(self, case: Case, count: int, seed: int = 0):
        g = torch.Generator(device="cuda").manual_seed(seed)
        requests, pages_per_request, page = case.requests, case.pages_per_request, case.page_size
        pages_per_set = requests * pages_per_request
        total_pages = count * pages_per_set
        c, r = case.head_dim, case.kpe_dim
        self.caches = (
            torch.zeros(total_pages, page, c // 2, dtype=torch.uint8, device="cuda"),
            torch.zeros(total_pages, page, c // 16, dtype=torch.uint8, device="cuda").view(torch.float8_e4m3fn),
            torch.zeros(total_pages, page, r, dtype=torch.uint8, device="cuda").view(torch.float8_e4m3fn),
        )
        self.sets = []
        for i in range(count):
            latent = torch.randn(case.nnz, c + r, generator=g, device="cuda").to(DTYPE)  # one projection output
            page_ids, indptr, last, batch, positions = _page_table(case, i * pages_per_set, g)
            as32 = lambda t: t.to(torch.int32).contiguous()  # noqa: E731
            self.sets.append(
                dict(
                    ckv=latent[:, :c],
                    kpe=latent[:, c:],
                    batch_indices=as32(batch),
                    positions=as32(positions),
                    kv_indices=as32(page_ids),
                    kv_indptr=as32(indptr),
                    kv_last_page_len=as32(last),
                    ckv_scale=nvfp4kv.global_scale_from_amax(float(latent[:, :c].float().abs().max())),
                    kpe_scale=float(latent[:, c:].float().abs().max()) / 448,
                )
            )

    def append(self, i: int) -> None:
        s = self.sets[i % len(self.sets)]
        nvfp4kv.nvfp4_quantize_append_paged_mla_kv_cache(
            s["ckv"], s["kpe"], s["batch_indices"], s["positions"], *self.caches, s["kv_indices"], s["kv_indptr"],
            s["kv_last_page_len"], s["ckv_scale"], s["kpe_scale"],
        )  # fmt: skip


def _page_table(case: Case, first_page: int, g: torch.Generator):
    """One input set's page table over pages first_page .. first_page + requests * pages_per_request - 1:
    (page_ids, kv_indptr, kv_last_page_len, batch_indices, positions), int64 on the GPU. Decode rows land at the
    last slot of a random-length request; prefill rows fill whole requests."""
    requests, pages_per_request, page = case.requests, case.pages_per_request, case.page_size
    page_ids = first_page + torch.randperm(requests * pages_per_request, generator=g, device="cuda")
    indptr = torch.arange(0, requests + 1, device="cuda") * pages_per_request
    if case.kind == "decode":
        last = torch.randint(1, page + 1, (requests,), generator=g, device="cuda")
        positions = (pages_per_request - 1) * page + last - 1
        batch = torch.arange(requests, device="cuda")
    else:
        last = torch.full((requests,), (case.tokens_per_request - 1) % page + 1, device="cuda")
        positions = torch.arange(case.tokens_per_request, device="cuda").repeat(requests)
        batch = torch.arange(requests, device="cuda").repeat_interleave(case.tokens_per_request)
    return page_ids, indptr, last, batch, positions


class InputSets:
    """`count` independent input sets of one case: keys, values and index tensors, each addressing its
    own pages of one shared (K, V) cache, so no two sets touch the same bytes."""

    def __init__(self, case: Case, count: int, seed: int = 0):
        g = torch.Generator(device="cuda").manual_seed(seed)
        requests = case.requests
        pages_per_request = case.pages_per_request
        pages_per_set = requests * pages_per_request
        total_pages = count * pages_per_set
        inner = [PAGE_SIZE, case.heads] if case.layout == "NHD" else [case.heads, PAGE_SIZE]
        self.k_cache = torch.zeros(total_pages, *inner, case.head_dim // 2, dtype=torch.uint8, device="cuda")
        self.v_cache = torch.zeros_like(self.k_cache)
        self.k_sf = torch.zeros(total_pages, *inner, case.head_dim // 16, dtype=torch.uint8, device="cuda").view(
            torch.float8_e4m3fn
        )
        self.v_sf = torch.zeros_like(self.k_sf)
        self.layout = case.layout
        self.case = case
        self.sets = []
        for i in range(count):
            key = torch.randn(case.nnz, case.heads, case.head_dim, generator=g, device="cuda", dtype=torch.float32)
            value = torch.randn(case.nnz, case.heads, case.head_dim, generator=g, device="cuda", dtype=torch.float32)
            key, value = key.to(DTYPE), value.to(DTYPE)
            page_ids, indptr, last, batch, positions = _page_table(case, i * pages_per_set, g)
            as32 = lambda t: t.to(torch.int32).contiguous()  # noqa: E731
            pages = page_ids[indptr[batch] + positions // PAGE_SIZE]
            self.sets.append(
                dict(
                    key=key,
                    value=value,
                    batch_indices=as32(batch),
                    positions=as32(positions),
                    slot_mapping=as32(pages * PAGE_SIZE + positions % PAGE_SIZE),
                    kv_indices=as32(page_ids),
                    kv_indptr=as32(indptr),
                    kv_last_page_len=as32(last),
                    k_scale=self._scale(key, case),
                    v_scale=self._scale(value, case),
                )
            )

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
                s["key"],
                s["value"],
                s["slot_mapping"],
                (self.k_cache, self.v_cache),
                (self.k_sf, self.v_sf),
                s["k_scale"],
                s["v_scale"],
                self.layout,
                **options,
            )
            return
        nvfp4kv.nvfp4_quantize_append_paged_kv_cache(
            s["key"],
            s["value"],
            s["batch_indices"],
            s["positions"],
            (self.k_cache, self.v_cache),
            (self.k_sf, self.v_sf),
            s["kv_indices"],
            s["kv_indptr"],
            s["kv_last_page_len"],
            s["k_scale"],
            s["v_scale"],
            self.layout,
            **options,
        )

    def torch_baseline(self, i: int) -> None:
        """What a user without this library would write: quantize with tensor ops (the reference's
        vectorized recipe), then scatter into the cache by advanced indexing."""
        s = self.sets[i % len(self.sets)]
        slot = s["kv_indptr"].long()[s["batch_indices"].long()] + s["positions"].long() // PAGE_SIZE
        page = s["kv_indices"].long()[slot]
        entry = s["positions"].long() % PAGE_SIZE
        for x, cache, sf, scale in (
            (s["key"], self.k_cache, self.k_sf, s["k_scale"]),
            (s["value"], self.v_cache, self.v_sf, s["v_scale"]),
        ):
            packed, scales = reference.quantize(x, scale)
            if self.layout == "NHD":
                cache[page, entry] = packed
                sf.view(torch.uint8)[page, entry] = scales.view(torch.uint8)
            else:
                cache.transpose(1, 2)[page, entry] = packed
                sf.view(torch.uint8).transpose(1, 2)[page, entry] = scales.view(torch.uint8)


def llama3_cos_sin_cache(max_pos: int, rotary_dim: int = 128) -> torch.Tensor:
    """[max_pos, rotary_dim] float32 cos | sin of Llama 3.1's RoPE (theta 500000, its long-context scaling of the
    inverse frequencies: factor 8, low / high frequency factors 1 / 4, original context 8192)."""
    inv_freq = 1.0 / 500000.0 ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim)
    wavelength = 2 * math.pi / inv_freq
    low, high = 8192 / 1.0, 8192 / 4.0  # wavelengths beyond `low` are scaled by 1/8, below `high` kept
    smooth = (8192 / wavelength - 1.0) / (4.0 - 1.0)
    scaled = torch.where(wavelength > low, inv_freq / 8, inv_freq)
    mid = (wavelength <= low) & (wavelength >= high)
    scaled = torch.where(mid, (1 - smooth) * inv_freq / 8 + smooth * inv_freq, scaled)
    angles = torch.arange(max_pos, dtype=torch.float64)[:, None] * scaled[None]
    return torch.cat([angles.cos(), angles.sin()], dim=1).to(torch.float32)


class RopeInputSets(InputSets):
    """InputSets of a fused RoPE case: Q, K and V as views of one packed [nnz, Hq + 2 Hkv, D] projection output,
    a preallocated Q out per set, and the Llama 3.1 cos/sin table over every position the sets use. FP8 Q has one
    decode scale for every set, as a layer has (a scale per set would recompile the unfused pipeline's RoPE for
    each value, which torch.compile guards on)."""

    def __init__(self, case: Case, count: int, seed: int = 0):
        super().__init__(case, count, seed)
        g = torch.Generator(device="cuda").manual_seed(seed + 1)
        hq, hkv, d = case.q_heads, case.heads, case.head_dim
        max_pos = max(int(s["positions"].max()) for s in self.sets) + 1
        self.cos_sin_cache = llama3_cos_sin_cache(max_pos, d).cuda()
        q_dtype = torch.float8_e4m3fn if case.q_fp8 else DTYPE
        q_scale = 8.0 / 448 if case.q_fp8 else None  # standard normal Q: |q| <= 8 in practice
        for s in self.sets:
            qkv = torch.randn(case.nnz, hq + 2 * hkv, d, generator=g, device="cuda").to(DTYPE)
            s["query"], s["key"], s["value"] = qkv[:, :hq], qkv[:, hq : hq + hkv], qkv[:, hq + hkv :]
            s["q_out"] = torch.empty(case.nnz, hq, d, dtype=q_dtype, device="cuda")
            s["q_scale"] = q_scale

    def append(self, i: int) -> None:
        s = self.sets[i % len(self.sets)]
        nvfp4kv.rope_quantize_nvfp4_append_paged_kv_cache(
            s["query"], s["key"], s["value"], self.cos_sin_cache, s["positions"], s["batch_indices"], s["positions"],
            (self.k_cache, self.v_cache), (self.k_sf, self.v_sf), s["kv_indices"], s["kv_indptr"],
            s["kv_last_page_len"], s["k_scale"], s["v_scale"], q_out=s["q_out"], q_scale=s["q_scale"],
        )  # fmt: skip

    def unfused(self, i: int) -> None:
        """The pipeline a user writes without the fused op: a compiled RoPE of Q and K, then the append."""
        s = self.sets[i % len(self.sets)]
        with torch._dynamo.config.patch(recompile_limit=_UNFUSED_COMPILES):
            _, k = _compiled_rope(s["query"], s["key"], self.cos_sin_cache, s["positions"], s["q_scale"])
        nvfp4kv.nvfp4_quantize_append_paged_kv_cache(
            k, s["value"], s["batch_indices"], s["positions"], (self.k_cache, self.v_cache), (self.k_sf, self.v_sf),
            s["kv_indices"], s["kv_indptr"], s["kv_last_page_len"], s["k_scale"], s["v_scale"],
        )  # fmt: skip


def _rope_qk(query, key, cos_sin_cache, positions, q_scale: Optional[float]):
    """NeoX RoPE of Q and K over the whole head (vLLM's forward_native, in float32), Q in FP8 when q_scale is given."""
    half = cos_sin_cache.shape[1] // 2
    cos_sin = cos_sin_cache[positions.long()]
    cos, sin = cos_sin[:, None, :half], cos_sin[:, None, half:]

    def rotate(x):
        x1, x2 = x[..., :half].float(), x[..., half:].float()
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)

    q = rotate(query)
    if q_scale is not None:
        q = (q.float() / q_scale).clamp(-448, 448).to(torch.float8_e4m3fn)
    return q, rotate(key)


# One static compile per case (shape and Q dtype). Past torch's default limit of 8 compiles per function, dynamo
# would silently run the RoPE eagerly; fullgraph turns that into an error, and the limit leaves room for every case.
_UNFUSED_COMPILES = 64
_compiled_rope = torch.compile(_rope_qk, dynamic=False, fullgraph=True)
