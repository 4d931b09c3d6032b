"""python -m nvfp4kv.eval end to end on a tiny random Llama saved to a folder (no download), and the
properties its numbers must have: bf16 K/V against itself is exactly the reference (KL 0), as is a
full-precision window covering the whole context; NVFP4 K/V move the perplexity and carry a relative
RMS error in NVFP4's range."""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

WORDS = [f"w{i}" for i in range(90)]


def save_tiny_model(folder):
    config = transformers.LlamaConfig(
        vocab_size=len(WORDS) + 1,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    vocab = {"<unk>": 0, **{w: i + 1 for i, w in enumerate(WORDS)}}
    tokenizer = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>").save_pretrained(folder)


def test_eval_runs_end_to_end(tmp_path, capsys):
    from nvfp4kv.eval.__main__ import main

    save_tiny_model(tmp_path / "model")
    generator = torch.Generator().manual_seed(2)
    text = tmp_path / "text.txt"
    text.write_text(" ".join(WORDS[i] for i in torch.randint(0, len(WORDS), (300,), generator=generator)))
    recipes = ["bf16", "nvfp4", "4over6", "scale=head", "scale=one", "k-only", "v-only", "window=64", "hadamard"]
    main(["--model", str(tmp_path / "model"), "--text", str(text), "--context", "64", "--device", "cpu"]
         + ["--out", str(tmp_path / "out"), "--recipes", *recipes])  # fmt: skip
    report = json.loads((tmp_path / "out" / "accuracy.json").read_text())
    assert (tmp_path / "out" / "accuracy.png").stat().st_size > 0
    assert "| nvfp4 |" in capsys.readouterr().out
    rows = {r["recipe"]: r for r in report["results"]["text.txt"]}
    assert list(rows) == recipes
    assert all(r["tokens"] == 300 - 5 for r in rows.values())  # 5 windows of 64 (or fewer) tokens
    bf16, nvfp4 = rows["bf16"], rows["nvfp4"]
    assert bf16["mean_kl"] == 0.0 and bf16["rel_rms_k"] == bf16["rel_rms_v"] == 0.0
    assert rows["window=64"]["mean_kl"] == 0.0  # every key of a 64-token window is within it: all exact
    assert rows["window=64"]["perplexity"] == bf16["perplexity"]
    for name in ("nvfp4", "4over6", "scale=head", "scale=one", "hadamard"):
        assert rows[name]["mean_kl"] > 0 and rows[name]["perplexity"] != bf16["perplexity"], name
        assert 0.03 < rows[name]["rel_rms_k"] < 0.3 and 0.03 < rows[name]["rel_rms_v"] < 0.3, name
    # Later layers see other inputs once earlier layers' K or V change, so the errors agree only roughly.
    assert rows["k-only"]["rel_rms_v"] == 0.0 and rows["k-only"]["rel_rms_k"] == pytest.approx(nvfp4["rel_rms_k"], 0.1)
    assert rows["v-only"]["rel_rms_k"] == 0.0 and rows["v-only"]["rel_rms_v"] == pytest.approx(nvfp4["rel_rms_v"], 0.1)


def test_bf16_perplexity_is_the_models_own(tmp_path):
    """The bf16 row against a plain forward of the unmodified model (its float32 K/V differ from bf16 K/V
    only by bf16 rounding, so the perplexities agree to a few parts in a thousand)."""
    from nvfp4kv.eval import evaluate, recipes

    save_tiny_model(tmp_path)
    model = transformers.LlamaForCausalLM.from_pretrained(tmp_path).eval()
    ids = torch.randint(0, len(WORDS) + 1, (1, 100), generator=torch.Generator().manual_seed(3))

    class Silent:
        def update(self, n):
            pass

    row = evaluate.evaluate_text(model, ids, recipes.parse_recipes(["bf16"]), 100, Silent())[0]
    with torch.inference_mode():
        logits = model(ids, use_cache=False).logits[0, :-1]
    expected = float(torch.nn.functional.cross_entropy(logits, ids[0, 1:]).exp())
    assert row["perplexity"] == pytest.approx(expected, rel=5e-3)
    assert model.config._attn_implementation != "nvfp4kv_eval"  # restored


def test_recipe_names_parse_and_bad_ones_are_refused():
    from nvfp4kv.eval.recipes import parse_recipe

    r = parse_recipe("k-only+window=16+hadamard+4over6+scale=head")
    assert (r.quantize_k, r.quantize_v, r.window, r.hadamard, r.scale_search, r.global_scale) == (
        True, False, 16, True, "4over6", "head"
    )  # fmt: skip
    with pytest.raises(ValueError, match="unknown part 'window=x'"):
        parse_recipe("window=x")
