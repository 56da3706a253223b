"""Exports: a checkpoint as a Hugging Face directory (asyncrl.export), its errors, and hub ids in model.path.

The export of a real run's checkpoint, compared with the run's final model, is in test_e2e (it reuses that run).
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from asyncrl.core.checkpoint import write_checkpoint
from asyncrl.core.models import builtin_dirname, resolve_model_path
from asyncrl.core.models.hub import hub_dirname, is_hub_id
from asyncrl.export import export_checkpoint, main, read_run_model

ROOT = Path(__file__).resolve().parents[1]


def fake_run(tmp_path: Path, steps: list[int]) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("model:\n  path: tiny\n")
    for step in steps:
        write_checkpoint(run, step, {"next_step": step}, lambda d: None, keep=10)
    return run


def test_not_a_run_directory(tmp_path, capsys):
    assert main([str(tmp_path)]) == 2
    assert "is not an asyncrl run directory (no config.yaml)" in capsys.readouterr().err
    assert main([str(tmp_path / "missing")]) == 2
    assert "is not a directory" in capsys.readouterr().err


def test_no_checkpoint(tmp_path):
    run = fake_run(tmp_path, [])
    with pytest.raises(ValueError, match=r"has no checkpoint in .*checkpoints \(run\.checkpoint_every was 0"):
        export_checkpoint(run)


def test_no_such_step_lists_the_steps_there_are(tmp_path):
    run = fake_run(tmp_path, [3, 6])
    with pytest.raises(ValueError, match=r"no checkpoint at step 4; its checkpoints are at steps 3, 6$"):
        export_checkpoint(run, step=4)


def test_a_checkpoint_without_learner_shards_is_named(tmp_path):
    run = fake_run(tmp_path, [3])
    with pytest.raises(ValueError, match=r"step-000003 has no learner/"):
        export_checkpoint(run, step=3)


def test_the_run_config_is_read_for_the_model_alone(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text("model: {path: some/dir, dtype: bfloat16}\nlearner: {lora: {rank: 4}}\nunknown_section: {x: 1}\n")
    run = read_run_model(config)  # keys of other sections (a run of another version) do not matter
    assert (run.model.path, run.dtype, run.lora.rank) == ("some/dir", torch.bfloat16, 4)
    config.write_text("model: {path: tiny, dtype: float8}\n")
    with pytest.raises(ValueError, match="config.yaml: the model or learner.lora settings do not load"):
        read_run_model(config)


def test_hub_ids_are_org_name_that_is_not_a_local_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert is_hub_id("Qwen/Qwen2.5-0.5B") and hub_dirname("Qwen/Qwen2.5-0.5B") == "hub--Qwen--Qwen2.5-0.5B"
    assert builtin_dirname("Qwen/Qwen2.5-0.5B", 2, 0) == "hub--Qwen--Qwen2.5-0.5B"  # cached, and copied to other nodes
    (tmp_path / "models" / "mine").mkdir(parents=True)
    assert not is_hub_id("models/mine")  # an existing local path stays local
    assert not is_hub_id("tiny") and not is_hub_id("/abs/path") and not is_hub_id("a/b/c")


def test_an_unreachable_hub_is_said_plainly_and_fast(tmp_path, monkeypatch):
    """The hub behind a closed port (this machine cannot reach the real one either): one quick failure, no retries."""
    import huggingface_hub.constants as hub_constants

    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hub_constants, "ENDPOINT", "http://127.0.0.1:9")
    t0 = time.monotonic()
    with pytest.raises(ValueError, match=r"^model\.path=org/name is not a local directory and the Hugging Face hub could not be reached: "):
        resolve_model_path("org/name", 2, 0, tmp_path / "cache")
    assert time.monotonic() - t0 < 15
    assert not (tmp_path / "cache" / "hub--org--name").exists()  # nothing half-downloaded left in the cache


def test_a_run_with_a_hub_id_offline_fails_before_ray_starts(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "asyncrl.run", "--config", "configs/smoke.yaml", f"run.output_dir={tmp_path / 'run'}",
           "model.path=org/name", "task.name=addition", f"model.cache_dir={tmp_path / 'cache'}"]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode != 0
    assert "model.path=org/name is not a local directory and the Hugging Face hub could not be reached" in proc.stderr + proc.stdout
    assert "Started a local Ray instance" not in proc.stderr + proc.stdout
    assert time.monotonic() - t0 < 60


def test_a_lora_checkpoint_exports_the_merged_model_and_the_adapter(random_model_dir, tmp_path):
    """From a trained LoRA learner's checkpoint: the merged model gives the learner's own final model's logits, and
    the adapter loaded by peft onto the base gives them too."""
    import yaml
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from tests.test_learner import fake_samples, learner

    lrn = learner(random_model_dir, "learner.lora.rank=4", "learner.lora.alpha=8", "learner.lora.target_modules=[q_proj, v_proj]")
    lrn.train_step(fake_samples(), version=0)  # the adapter moves off B = 0
    run = tmp_path / "run"
    run.mkdir()
    config = lrn.cfg.to_dict()
    config["model"]["path"] = random_model_dir
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    write_checkpoint(run, 1, {"next_step": 1}, lambda d: lrn.save_checkpoint(str(d)), keep=2)
    lrn.save(str(run / "final_model"), random_model_dir)
    out = export_checkpoint(run)
    assert out == run / "exports" / "step-000001"
    ids = torch.tensor([[1, 5, 9, 3, 7]])
    with torch.no_grad():
        final = AutoModelForCausalLM.from_pretrained(run / "final_model")(ids).logits
        base = AutoModelForCausalLM.from_pretrained(random_model_dir)
        assert not torch.allclose(base(ids).logits, final, atol=1e-4)  # the adapter changed the policy
        assert torch.equal(AutoModelForCausalLM.from_pretrained(out)(ids).logits, final)
        adapted = PeftModel.from_pretrained(base, out / "adapter")(ids).logits
    assert torch.allclose(adapted, final, atol=1e-5)
