"""The critic for algorithms with `critic = True`: the policy's transformer body plus a scalar head."""
from __future__ import annotations

import torch
from transformers import AutoModel
from transformers.utils import logging as hf_logging

from asyncrl.core.batching import Batch


class ValueModel(torch.nn.Module):
    """V(s_t) at every position of the learner's [B, T] layout, initialised from the policy checkpoint.

    The head starts at zero, so the first values are 0 and the first advantages
    are the (whitened) rewards; the body starts from the policy's weights and is
    trained separately (its own optimizer), so the value loss never moves the policy.
    """

    def __init__(self, model_path: str, dtype: torch.dtype) -> None:
        super().__init__()
        level = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()  # the checkpoint's unused lm_head is expected, not news
        try:
            self.body = AutoModel.from_pretrained(model_path, dtype=dtype)
        finally:
            hf_logging.set_verbosity(level)
        self.head = torch.nn.Linear(self.body.config.hidden_size, 1, dtype=dtype)
        torch.nn.init.zeros_(self.head.weight)
        torch.nn.init.zeros_(self.head.bias)

    def forward(self, batch: Batch) -> torch.Tensor:
        hidden = self.body(input_ids=batch.input_ids, attention_mask=batch.attention_mask).last_hidden_state
        return self.head(hidden[:, :-1]).squeeze(-1).float() * batch.response_mask  # [B, T]
