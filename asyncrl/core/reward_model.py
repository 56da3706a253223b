"""A reward model as a reward: a local Hugging Face sequence-classification model scores prompt + response.

`task.reward=reward_model` with `reward.model_path` (a local directory) and a reward pool (`reward.num_workers` >= 1):
each reward worker loads the model once, on its GPU when `reward.num_gpus` > 0, and scores batches of samples
in one forward pass. The score is the model's first logit (a one-label head, as reward models are trained).
"""
from __future__ import annotations

import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from asyncrl.core.reward_traits import reward
from asyncrl.core.prompts import Prompt


@reward(batched=True, deterministic=True, version="1")
class RewardModel:
    """Batched scoring with a sequence-classification model (`model_path`), on `device`."""

    def __init__(self, model_path: str, device: str, max_length: int = 512) -> None:
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model = AutoModelForSequenceClassification.from_pretrained(model_path).to(device).eval()
        self.model.config.pad_token_id = self.tokenizer.pad_token_id
        self.device, self.max_length = device, max_length

    @torch.no_grad()
    def __call__(self, prompts: list[Prompt], responses: list[str]) -> list[float]:
        texts = [p.text + r for p, r in zip(prompts, responses)]
        enc = self.tokenizer(texts, return_tensors="pt", padding=True, truncation=True, max_length=self.max_length).to(self.device)
        logits = self.model(**enc).logits  # [B, num_labels]
        return logits[:, 0].float().tolist()
