"""bench/delta_sync.py's pure parts: what counts as changed in each dtype, a delta's size, the verdict and its table."""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from delta_sync import changed, delta_bytes, render, verdict  # noqa: E402


def test_a_change_below_bf16_rounding_is_a_change_in_float32_only():
    before = {"w": torch.ones(4), "b": torch.zeros(2)}
    after = {"w": torch.tensor([1.0, 1.0 + 1e-6, 1.5, 1.0]), "b": torch.zeros(2)}
    out = changed(before, after)
    assert out["float32"] == (2, 6, 4) and out["bfloat16"] == (1, 6, 2)  # 1 + 1e-6 rounds to 1 in bf16


def test_a_delta_pays_only_when_encoding_and_sending_it_beat_sending_everything():
    assert delta_bytes(10, 2) == 60
    cheap = verdict(full_bytes=1000, delta=60, send_s_per_byte=1e-3, encode_s=0.1)
    assert cheap["full_s"] == 1.0 and abs(cheap["delta_s"] - 0.16) < 1e-9 and cheap["ratio"] < 1
    assert verdict(full_bytes=1000, delta=1500, send_s_per_byte=1e-3, encode_s=0.1)["ratio"] > 1


def test_the_table_shows_both_dtypes():
    pair = {"float32": {"changed": 90, "elements": 100, "fraction": 0.9}, "bfloat16": {"changed": 5, "elements": 100, "fraction": 0.05}}
    data = {"config": "c.yaml", "lr": 1e-6, "elements": 100, "pairs": [pair, pair], "send_s": 1.0, "full_bytes_float32": 400,
            "encode_s": 0.1, "verdict": {"float32": {"full_s": 1.0, "delta_s": 1.45, "ratio": 1.45, "bytes_ratio": 1.8},
                                         "bfloat16": {"full_s": 0.5, "delta_s": 0.175, "ratio": 0.35, "bytes_ratio": 0.15}}}
    text = render(data)
    assert "| float32 | 90.0% (90.0%–90.0%) | 1.80 |" in text and "**0.35** |" in text
