"""python -m nvfp4kv: the main job in miniature.

Builds a small paged NVFP4 cache on the best available device, appends a prefill and a few decode
steps through the public API, reads every request back with dequantize, and prints the
quantization error and the append throughput.
"""

from __future__ import annotations

import argparse
import time

import torch

import nvfp4kv


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m nvfp4kv", description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--requests", type=int, default=4)
    parser.add_argument("--prefill", type=int, default=200, help="prompt tokens per request")
    parser.add_argument("--decode-steps", type=int, default=8)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--page-size", type=int, default=16)
    parser.add_argument("--layout", choices=["NHD", "HND"], default="NHD")
    return parser.parse_args()


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main() -> None:
    args = parse_args()
    device = torch.device(args.device)
    torch.manual_seed(0)
    batch, heads, head_dim, page_size = args.requests, args.heads, args.head_dim, args.page_size
    max_len = args.prefill + args.decode_steps
    pages_per_request = -(-max_len // page_size)
    num_pages = batch * pages_per_request
    inner = (page_size, heads) if args.layout == "NHD" else (heads, page_size)
    cache = torch.zeros(num_pages, 2, *inner, head_dim // 2, dtype=torch.uint8, device=device)
    cache_sf = torch.zeros(num_pages, 2, *inner, head_dim // 16, dtype=torch.float8_e4m3fn, device=device)
    # Pages of the requests, shuffled over the cache as an allocator would leave them.
    kv_indices = torch.randperm(num_pages, device=device).to(torch.int32)

    # Calibrated global scales: the largest block scale lands at the top of E4M3 (amax / (6 * 448)).
    history_k = torch.randn(batch, max_len, heads, head_dim, device=device, dtype=torch.bfloat16)
    history_v = torch.randn(batch, max_len, heads, head_dim, device=device, dtype=torch.bfloat16)
    k_scale = float(history_k.abs().max()) / (6 * 448)
    v_scale = float(history_v.abs().max()) / (6 * 448)

    seq_len, elapsed, bytes_moved = 0, 0.0, 0

    def append(step_tokens: int) -> None:
        """Appends step_tokens tokens to every request (all requests share one length here)."""
        nonlocal seq_len, elapsed, bytes_moved
        first, seq_len = seq_len, seq_len + step_tokens
        used_pages = -(-seq_len // page_size)
        # Each request owns a contiguous run of kv_indices; describe just the pages in use.
        used_indices = kv_indices.view(batch, pages_per_request)[:, :used_pages].flatten()
        request_indptr = torch.arange(0, (batch + 1) * used_pages, used_pages, dtype=torch.int32, device=device)
        last_page_len = torch.full((batch,), (seq_len - 1) % page_size + 1, dtype=torch.int32, device=device)
        seq_lens = nvfp4kv.get_seq_lens(request_indptr, last_page_len, page_size)
        append_indptr = torch.arange(0, (batch + 1) * step_tokens, step_tokens, dtype=torch.int32, device=device)
        batch_indices, positions = nvfp4kv.get_batch_indices_positions(append_indptr, seq_lens, batch * step_tokens)
        key = history_k[:, first:seq_len].flatten(0, 1)
        value = history_v[:, first:seq_len].flatten(0, 1)
        synchronize(device)
        t0 = time.perf_counter()
        nvfp4kv.nvfp4_quantize_append_paged_kv_cache(
            key,
            value,
            batch_indices,
            positions,
            cache,
            cache_sf,
            used_indices,
            request_indptr,
            last_page_len,
            k_scale,
            v_scale,
            args.layout,
        )
        synchronize(device)
        elapsed += time.perf_counter() - t0
        bytes_moved += 2 * key.numel() * key.element_size() + 2 * (key.numel() // 2 + key.numel() // 16)

    append(args.prefill)
    for _ in range(args.decode_steps):
        append(1)

    # Read every request back and compare with what was appended.
    errors, scales = [], []
    for kv, history, scale in ((0, history_k, k_scale), (1, history_v, v_scale)):
        packed, block_scales = cache[:, kv], cache_sf[:, kv]
        values = nvfp4kv.dequantize(packed, block_scales, scale)  # [pages, *inner, head_dim]
        if args.layout == "HND":
            values = values.transpose(1, 2)
        per_request = values[kv_indices.long()].reshape(batch, pages_per_request * page_size, heads, head_dim)
        errors.append(per_request[:, :max_len] - history.float())
        scales.append(history.float())
    error, reference = torch.cat([e.flatten() for e in errors]), torch.cat([s.flatten() for s in scales])
    rel_rms = float(error.norm() / reference.norm())
    print(
        f"nvfp4kv {nvfp4kv.__version__} on {device} ({args.layout}, {batch} requests, {heads} KV heads, "
        f"head_dim {head_dim}, page {page_size})"
    )
    print(f"appended {batch * max_len} tokens: prefill of {args.prefill} + {args.decode_steps} decode steps")
    print(
        f"cache: {cache.numel() + cache_sf.numel()} bytes for {2 * reference.numel()} bytes of bf16 "
        f"({2 * reference.numel() / (cache.numel() + cache_sf.numel()):.2f}x smaller)"
    )
    print(
        f"dequantized error: relative RMS {rel_rms:.4f}, max abs {float(error.abs().max()):.4f}, "
        f"mean abs {float(error.abs().mean()):.4f} (max |x| {float(reference.abs().max()):.3f})"
    )
    print(
        f"append throughput: {bytes_moved / elapsed / 1e9:.2f} GB/s over {1 + args.decode_steps} calls "
        f"({elapsed * 1e3:.2f} ms, host overhead included)"
    )


if __name__ == "__main__":
    main()
