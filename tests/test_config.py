"""Config: types, unknown keys, impossible values, overrides; and the CLI's exit status 2."""
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from asyncrl.core.config import (Config, ConfigError, RolloutConfig, config_from_dict, cross_checks, load_config,
                                 parse_override)

ROOT = Path(__file__).resolve().parents[1]


def test_defaults_and_yaml_and_overrides():
    cfg = load_config(ROOT / "configs/smoke.yaml", ["learner.lr=1e-5", "run.steps=20", "logging.wandb=false"])
    assert cfg.learner.lr == pytest.approx(1e-5) and isinstance(cfg.learner.lr, float)
    assert cfg.run.steps == 20 and cfg.logging.wandb is False
    assert cfg.rollout.group_size == 4  # from the YAML
    assert cfg.groups_per_step == cfg.learner.batch_size // 4


def test_default_yaml_loads():
    cfg = load_config(ROOT / "configs/default.yaml")
    assert cfg.rollout.cpu_affinity == [0] and cfg.learner.cpu_affinity == [1]


@pytest.mark.parametrize("path", sorted((ROOT / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_config_validates(path):
    load_config(path)


def test_resources_are_mappings_of_amounts():
    cfg = load_config(None, ["learner.resources={learner_node: 1}", "rollout.resources={rollout_node: 0.5}"])
    assert cfg.learner.resources == {"learner_node": 1.0} and cfg.rollout.resources == {"rollout_node": 0.5}


def test_parse_override_types():
    assert parse_override("a.b=3") == ("a.b", 3)
    assert parse_override("a.b=1e-5") == ("a.b", 1e-5)
    assert parse_override("a.b=true") == ("a.b", True)
    assert parse_override("a.b=[0, 1]") == ("a.b", [0, 1])
    assert parse_override("a.b=grpo") == ("a.b", "grpo")


@pytest.mark.parametrize(
    "override, key",
    [
        ("learner.nope=1", "learner.nope"),
        ("nosection.x=1", "nosection"),
        ("run.steps=ten", "run.steps"),
        ("run.steps=2.5", "run.steps"),
        ("logging.wandb=3", "logging.wandb"),
        ("buffer.max_staleness=-1", "buffer.max_staleness"),
        ("learner.batch_size=10", "learner.batch_size"),
        ("rollout.cpu_affinity=[a]", "rollout.cpu_affinity[0]"),
        ("algorithm.correction=magic", "algorithm.correction"),
        ("task.eval_size=500", "task.eval_size"),
        ("learner.num_workers=3", "learner.num_workers"),
        ("rollout.weight_update=pause", "rollout.weight_update"),
        ("learner.resources={GPU: 1}", "learner.resources"),
        ("rollout.resources=[1]", "rollout.resources"),
        ("rollout.resources={node: x}", "rollout.resources.node"),
        ("algorithm.kl_penalty=both", "algorithm.kl_penalty"),
        ("algorithm.lam=1.5", "algorithm.lam"),
        ("task.name=jsonl", "data.train"),
    ],
)
def test_errors_name_the_key(override, key):
    with pytest.raises(ConfigError) as err:
        load_config(ROOT / "configs/smoke.yaml", [override])
    assert err.value.key == key
    assert str(err.value).startswith(key)


def test_int_accepted_for_float():
    assert load_config(None, ["learner.lr=1"]).learner.lr == 1.0


@pytest.mark.parametrize(
    "override, key",
    [("learner.bogus=1", "learner.bogus"), ("run.steps=abc", "run.steps"), ("buffer.max_staleness=-1", "buffer.max_staleness"), ("learner.batch_size=6", "learner.batch_size")],
)
def test_cli_exits_2_naming_the_key(override, key):
    proc = subprocess.run(
        [sys.executable, "-m", "asyncrl.run", "--config", str(ROOT / "configs/smoke.yaml"), override],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and key in lines[0], proc.stderr


@pytest.mark.parametrize(
    "override, message",
    [("algorithm.name=nope", "unknown algorithm 'nope'; registered: grpo"), ("task.reward=nope.fn", "cannot import module 'nope'"),
     ("model.path=/nonexistent/model", "/nonexistent/model"),
     ("run.ray_address=127.0.0.1:1", "Ray address '127.0.0.1:1' (run.ray_address or RAY_ADDRESS): nothing answers")],
)
def test_cli_names_bad_plugins_and_model_paths_before_ray(override, message, tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "asyncrl.run", "--config", str(ROOT / "configs/smoke.yaml"), override, f"run.output_dir={tmp_path}/r"],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "r").exists()  # nothing written for a run that never started


def test_a_config_file_starts_from_its_base(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "base.yaml").write_text("rollout: {group_size: 4, cpu_affinity: [0], temperature: 0.5}\nlearner: {batch_size: 8}\n")
    (tmp_path / "sub" / "top.yaml").write_text("base: ../base.yaml\nrollout: {cpu_affinity: [], temperature: 0.9}\n")
    cfg = load_config(tmp_path / "sub" / "top.yaml", ["learner.batch_size=16"])
    assert (cfg.rollout.group_size, cfg.rollout.cpu_affinity, cfg.rollout.temperature) == (4, [], 0.9)  # the base's, laid over
    assert cfg.learner.batch_size == 16  # overrides last


def test_a_missing_or_circular_base_is_named(tmp_path):
    (tmp_path / "a.yaml").write_text("base: b.yaml\n")
    with pytest.raises(ValueError, match=r"base.*file not found: .*b\.yaml \(the base of .*a\.yaml\)"):
        load_config(tmp_path / "a.yaml")
    (tmp_path / "b.yaml").write_text("base: a.yaml\n")
    with pytest.raises(ValueError, match="its bases lead back to"):
        load_config(tmp_path / "a.yaml")


def test_the_synchronous_baseline_is_the_async_recipe_run_in_turns():
    """configs/smollm2_word_problems_sync.yaml changes only how the work is scheduled: same model, task, sampling,
    algorithm and optimizer updates of the same size."""
    asyn = load_config(ROOT / "configs" / "smollm2_word_problems.yaml").to_dict()
    sync = load_config(ROOT / "configs" / "smollm2_word_problems_sync.yaml").to_dict()
    changed = {(section, key) for section in sync for key in sync[section] if sync[section][key] != asyn[section][key]}
    assert changed == {("rollout", "cpu_affinity"), ("rollout", "torch_threads"),
                       ("buffer", "max_staleness"), ("learner", "batch_size"), ("learner", "mini_batches"),
                       ("learner", "cpu_affinity"), ("learner", "torch_threads"), ("run", "output_dir")}
    assert sync["learner"]["batch_size"] // sync["learner"]["mini_batches"] == asyn["learner"]["batch_size"]  # update size
    assert sync["rollout"]["max_inflight_groups"] * sync["rollout"]["group_size"] == sync["learner"]["batch_size"]


@pytest.mark.parametrize("sections", [
    {"rollout": {"keep_kv": True, "engine": "sglang"}},  # a section's own rule
    {"rollout": {"tensor_parallel_size": 2}},
    {"learner": {"lora": {"rank": 8, "target_modules": []}}},  # a nested section's
    {"learner": {"batch_size": 16, "num_workers": 3}},
    {"algorithm": {"rc_low": 2.0, "rc_high": 1.0}},
    {"run": {"eval_pass_k": 2}},
    {"learner": {"batch_size": 10}},  # two sections' (rollout.group_size is 8)
    {"model": {"max_model_len": 8}},
    {"task": {"eval_size": 500}},
    {"model": {"path": "/m"}, "task": {"name": "dataset"}},
    {"task": {"reward": "reward_model"}, "reward": {"num_workers": 1}},
])
def test_a_config_built_in_code_breaks_the_rules_a_loaded_one_does(sections):
    with pytest.raises(ConfigError) as loaded:
        config_from_dict(sections)
    expected = (loaded.value.key, str(loaded.value))
    with pytest.raises(ConfigError) as from_mappings:
        Config(**sections)
    assert (from_mappings.value.key, str(from_mappings.value)) == expected
    with pytest.raises(ConfigError) as from_sections:  # each section built first: its own rules fire there
        Config(**{name: Config.model_fields[name].annotation(**values) for name, values in sections.items()})
    assert (from_sections.value.key, str(from_sections.value)) == expected


def test_a_section_built_alone_keeps_pydantics_error_for_a_bad_value():
    with pytest.raises(ConfigError, match=r"^rollout\.tensor_parallel_size: must be 1 on the CPU"):
        RolloutConfig(tensor_parallel_size=2)
    with pytest.raises(ValidationError):  # no section to name in the key: asyncrl.export reads it so
        RolloutConfig(group_size=1)


def test_a_changed_config_is_checked_again_by_cross_checks():
    cfg = Config()
    assert cross_checks(cfg) is cfg
    copied = cfg.model_copy(update={"rollout": RolloutConfig(max_new_tokens=64)})  # pydantic does not validate an update
    with pytest.raises(ConfigError, match="^model.max_model_len: must exceed rollout.max_new_tokens"):
        cross_checks(copied)
    cfg.task.eval_size = 500  # nor an assignment
    with pytest.raises(ConfigError, match="^task.eval_size: must be <= 200 with model.path=tiny"):
        cross_checks(cfg)


def test_a_run_config_yaml_reads_back_as_the_same_config():
    cfg = load_config(ROOT / "configs/smoke.yaml")
    assert config_from_dict(cfg.to_dict()) == cfg


def test_the_expiring_group_wait_must_end_before_the_batch_timeout():
    with pytest.raises(ConfigError, match="buffer.expiring_wait_s.*less than buffer.sample_timeout_s"):
        load_config(None, ["buffer.expiring_wait_s=600", "buffer.sample_timeout_s=600"])
    assert load_config(None, ["buffer.expiring_wait_s=0"]).buffer.expiring_wait_s == 0
