"""The `asyncrl` command: its subcommands, `run --help` listing every config key, `run --print-config`."""
from __future__ import annotations

import pytest
import yaml

from asyncrl import cli
from asyncrl.core.config import config_keys, load_config
from asyncrl.run import keys_help


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    try:
        rc = cli.main(list(argv))
    except SystemExit as exc:  # argparse's --help exits
        rc = exc.code
    out, err = capsys.readouterr()
    return rc, out, err


def test_run_help_lists_every_key_with_its_type_default_and_doc(capsys):
    rc, out, _ = run_cli(capsys, "run", "--help")
    assert rc == 0 and out.startswith("usage: asyncrl run")
    keys = config_keys()
    assert len(keys) > 100
    for k in keys:
        assert f"  {k.key} ({k.type}, default {k.default!r})" in out, k.key
    lr = next(k for k in keys if k.key == "learner.lr")
    assert lr.type == "float" and lr.default == 1e-4 and "AdamW" in lr.doc
    assert "learner.lora.rank (int, default 0)" in out  # nested sections are flattened
    assert "rollout.engine (one of: vllm, sglang, default 'vllm')" in out


def test_keys_help_groups_keys_by_section_and_wraps_docs():
    text = keys_help(config_keys()[:3], width=40)
    lines = text.splitlines()
    assert lines[2] == "model:" and lines[3].startswith("  model.path (str, default 'tiny')")
    assert all(len(line) <= 40 for line in lines[4:] if line.startswith("      "))


def test_print_config_prints_the_resolved_config_and_starts_nothing(capsys, tmp_path):
    cfg_file = tmp_path / "job.yaml"
    cfg_file.write_text("learner: {lr: 0.001}\nrun: {steps: 7}\n")
    rc, out, _ = run_cli(capsys, "run", "--config", str(cfg_file), "--print-config", "rollout.group_size=4", "learner.batch_size=16")
    assert rc == 0
    printed = yaml.safe_load(out)
    want = load_config(cfg_file, ["rollout.group_size=4", "learner.batch_size=16"]).to_dict()
    assert printed == want
    assert printed["learner"]["lr"] == 0.001 and printed["run"]["steps"] == 7 and printed["rollout"]["group_size"] == 4
    assert not (tmp_path / "runs").exists()


def test_a_bad_key_is_a_config_error_with_exit_status_2(capsys):
    rc, _, err = run_cli(capsys, "run", "--print-config", "learner.nope=1")
    assert rc == 2 and "learner.nope: unknown key" in err


@pytest.mark.parametrize("argv, rc", [([], 2), (["--help"], 0)])
def test_no_command_prints_the_commands(capsys, argv, rc):
    code, out, _ = run_cli(capsys, *argv)
    assert code == rc and all(name in out for name in ("run", "inspect", "plot", "export"))


def test_unknown_command_names_it(capsys):
    rc, _, err = run_cli(capsys, "train")
    assert rc == 2 and "unknown command 'train'" in err


def test_version(capsys):
    rc, out, _ = run_cli(capsys, "--version")
    assert rc == 0 and out.startswith("asyncrl 0.")


@pytest.mark.parametrize("name", ["inspect", "plot", "export"])
def test_each_command_reaches_its_module(capsys, name):
    rc, out, _ = run_cli(capsys, name, "--help")
    assert rc == 0 and "usage:" in out
