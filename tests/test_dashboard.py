"""The wandb workspace command: its panels name real metrics, and offline it explains instead of crashing."""
import re
import subprocess
import sys
from pathlib import Path

from asyncrl.analysis.dashboard import SECTIONS, build_workspace

ROOT = Path(__file__).resolve().parents[1]


def test_every_panel_metric_is_documented():
    documented = set(re.findall(r"`([a-z_]+/[a-z0-9_<>/]+)`", (ROOT / "docs/metrics.md").read_text()))
    panels = [key for _, keys in SECTIONS for key in keys]
    assert not set(panels) - documented


def test_workspace_is_built_with_one_section_per_group():
    ws = build_workspace("team", "asyncrl", "overview")
    assert [s.name for s in ws.sections] == [title for title, _ in SECTIONS]
    assert sum(len(s.panels) for s in ws.sections) == sum(len(keys) for _, keys in SECTIONS)


def test_offline_prints_what_to_do_and_exits_1(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}  # no WANDB_API_KEY, no ~/.netrc
    proc = subprocess.run([sys.executable, "-m", "asyncrl.analysis.dashboard"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert "offline" in proc.stderr and "wandb sync" in proc.stderr and "Traceback" not in proc.stderr
