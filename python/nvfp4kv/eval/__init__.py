"""Perplexity and KL cost of NVFP4 K/V on a real causal LM: `python -m nvfp4kv.eval --help`.

Each layer's post-RoPE K/V go through the library's op (append into a paged cache, dequantize) inside an
attention function registered with transformers; recipes (recipes.py) choose what is quantized and how.
"""
