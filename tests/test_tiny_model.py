"""The tiny addition model: tokenizer, HF loading, determinism, path resolution, warm-start."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from asyncrl.core.models.tiny import (
    BOS_ID,
    EOS_ID,
    TinySpec,
    build_tiny_model,
    build_tokenizer,
    greedy_accuracy,
)
from asyncrl.core.models import resolve_model_path
from asyncrl.core.tasks import AdditionTask

# A few SFT steps only: enough to check determinism and the saved layout, in seconds.
QUICK = replace(TinySpec(), sft_steps=3, batch_size=8, eval_size=10, samples_per_prompt=2)


def test_tokenizer_is_char_level_with_bos_and_round_trips():
    tok = build_tokenizer()
    ids = tok("12+3= 4").input_ids
    assert ids[0] == BOS_ID and len(ids) == 1 + len("12+3= 4")
    assert tok.decode(ids + [EOS_ID], skip_special_tokens=True) == "12+3= 4"
    assert tok.convert_tokens_to_ids(["<pad>", "<s>", "</s>"]) == [0, 1, 2]


def test_built_dir_loads_with_auto_classes(tiny_model_dir):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert tok("37+85=").input_ids == build_tokenizer()("37+85=").input_ids
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (1, 2, 0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    cfg = model.config
    assert cfg.hidden_size // cfg.num_attention_heads == 64  # vLLM CPU attention needs it
    assert cfg.vocab_size % 8 == 0 and cfg.vocab_size >= len(tok)
    assert model.dtype == torch.float32 and model.generation_config.eos_token_id == EOS_ID
    assert sum(p.numel() for p in model.parameters()) < 1_500_000


def test_same_seed_gives_identical_weights(tmp_path):
    for name, seed in [("a", 0), ("b", 0), ("c", 1)]:
        build_tiny_model(tmp_path / name, replace(QUICK, seed=seed))
    a, b, c = (load_file(tmp_path / n / "model.safetensors") for n in "abc")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], c[k]) for k in a)
    info = json.loads((tmp_path / "a" / "warmstart.json").read_text())
    assert info["spec"]["sft_steps"] == 3 and "greedy_accuracy" in info["metrics"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp dirs left


def test_resolve_model_path_validates_local_dirs(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(ValueError, match="nope"):
        resolve_model_path(str(missing), 2, 0, str(tmp_path))
    with pytest.raises(ValueError, match="config.json"):
        resolve_model_path(str(tmp_path), 2, 0, str(tmp_path))
    (tmp_path / "config.json").write_text("{}")
    assert resolve_model_path(str(tmp_path), 2, 0, str(tmp_path)) == tmp_path


def test_tiny_path_is_cached_and_named_by_spec(tiny_model_dir):
    path = Path(tiny_model_dir)
    assert path.name.startswith("tiny-addition-d2-s0-") and path.name.endswith(TinySpec().key())
    assert resolve_model_path("tiny", 2, 0, str(path.parent)) == path  # second call: no build


def test_warm_start_accuracy_is_partial(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    acc = greedy_accuracy(model, tok, AdditionTask(digits=2, eval_size=200, seed=0).eval_prompts())
    assert 0.05 < acc < 0.9
    recorded = json.loads((Path(tiny_model_dir) / "warmstart.json").read_text())["metrics"]
    assert acc == pytest.approx(recorded["greedy_accuracy"], abs=0.02)
