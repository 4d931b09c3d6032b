"""python -m nvfp4kv.bench: speed of the CUDA append kernel against the GPU's own limits.

In ONE run it measures
  * the bandwidth ceiling: a device-to-device copy of a few GiB (bytes read + bytes written per second);
  * the launch floor: an empty kernel replayed in a CUDA graph (time per launch);
  * every benchmark case (8 KV heads, page size 16, bf16): decode nnz 1..1024 (one token per request;
    per launch, and per launch inside a CUDA graph), prefill nnz 4096/16384/65536 NHD and HND at
    head_dim 128, and nnz 16384 at head_dim 64 and 256: time, GB/s (bf16 K+V read + packed data +
    scales written) and % of the copy ceiling; then the variants (slot mapping, trtllm V scales,
    4-over-6, scales on the device, one KV head), in the table only; the MLA latent append; the fused
    RoPE + append of a Llama-3-8B layer, beside the unfused pipeline (a compiled RoPE, then the append);
  * the same shapes through a straightforward pure-PyTorch implementation (what a user without this
    library would write), for the speed-up;
  * the eager host overhead of the Python API on a tiny input, against one Tensor.index_copy_.
Times are medians of many CUDA-event samples after warm-up. Every sample walks fresh input sets
(keys, values, index tensors and the cache pages they address), rotated over more than 4x the L2
size; where the sets of a small case cannot add up to that, L2 is flushed before each sample, so
every launch still reads its inputs from memory. Writes a JSON file and a PNG chart (matplotlib,
optional) and shows a progress bar (tqdm).

Modules: cases (the cases and their input sets), timing (the harness and the GPU's limits), report
(table, JSON, chart), __main__ (the command line).
"""
