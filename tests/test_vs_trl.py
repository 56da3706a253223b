"""bench/vs_trl.py's pure logic: the asyncrl clock from metrics rows, time to threshold, the ratios (no runs, no TRL)."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.bench_modules import load

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.fixture(scope="module")
def vs_trl():
    return load("vs_trl")  # it imports results_io as a sibling, as when run as a script


def rows(step_s: list[float], batch: int = 64, pause: float = 0.0, wait: float = 0.1, sync: float = 0.01) -> list[dict]:
    """Metrics rows of steps lasting `step_s` (wait, train, sync) with `pause` seconds between steps, from t=1000."""
    out, t = [], 1000.0
    for i, s in enumerate(step_s):
        out.append({"step": i, "time/step_s": s, "samples/trained_total": batch * (i + 1), "time/learner_wait_s": wait,
                    "time/train_start": t + wait, "time/train_end": t + s - sync, "time/weight_sync_s": sync})
        t += s + pause
    return out


def test_asyncrl_clock_is_wall_time_from_the_first_step(vs_trl):
    points = vs_trl.asyncrl_points(rows([2.0, 0.5, 0.25, 0.25, 0.5]), [0, 2, 4, 5])
    assert [p["step"] for p in points] == [0, 2, 4, 5]
    assert [p["train_s"] for p in points] == pytest.approx([0.0, 2.5, 3.0, 3.5])
    assert [p["samples"] for p in points] == [0, 128, 256, 320]


def test_asyncrl_clock_counts_the_pauses_between_steps(vs_trl):
    points = vs_trl.asyncrl_points(rows([1.0, 1.0, 1.0], pause=0.5), [1, 3])
    assert [p["train_s"] for p in points] == pytest.approx([1.0, 4.0])  # two pauses before the end of step 2


def test_asyncrl_clock_refuses_a_gap_in_the_metrics(vs_trl):
    with pytest.raises(ValueError, match="lacks steps"):
        vs_trl.asyncrl_points([r for r in rows([1.0, 1.0, 1.0]) if r["step"] != 1], [3])


def test_snapshot_steps_start_at_zero_and_end_at_the_last_step(vs_trl):
    assert vs_trl.snapshot_steps(40, 5) == [0, 5, 10, 15, 20, 25, 30, 35, 40]
    assert vs_trl.snapshot_steps(7, 3) == [0, 3, 6, 7]


def test_time_to_threshold_is_the_first_snapshot_at_or_above_it(vs_trl):
    timeline = [  # out of order on purpose; accuracy dips after first crossing
        {"step": 10, "train_s": 3.0, "samples": 640, "accuracy": 0.72},
        {"step": 0, "train_s": 0.0, "samples": 0, "accuracy": 0.50},
        {"step": 5, "train_s": 1.5, "samples": 320, "accuracy": 0.70},
        {"step": 15, "train_s": 4.5, "samples": 960, "accuracy": 0.65},
    ]
    assert vs_trl.time_to_threshold(timeline, 0.7)["step"] == 5
    assert vs_trl.time_to_threshold(timeline, 0.71)["train_s"] == 3.0
    assert vs_trl.time_to_threshold(timeline, 0.9) is None


def test_ratios_say_how_many_times_faster_asyncrl_is(vs_trl):
    asyncrl = [{"step": 0, "train_s": 0.0, "samples": 0, "accuracy": 0.5},
               {"step": 10, "train_s": 2.0, "samples": 640, "accuracy": 0.8}]
    trl = [{"step": 0, "train_s": 0.0, "samples": 0, "accuracy": 0.5},
           {"step": 5, "train_s": 3.0, "samples": 320, "accuracy": 0.75},
           {"step": 10, "train_s": 8.0, "samples": 640, "accuracy": 0.8}]
    r = vs_trl.ratios(asyncrl, trl, 0.75)
    assert r["time_to_threshold"] == pytest.approx(3.0 / 2.0)  # TRL seconds / asyncrl seconds
    assert r["samples_per_s"] == pytest.approx((640 / 2.0) / (640 / 8.0))
    assert vs_trl.ratios(asyncrl, trl, 0.9)["time_to_threshold"] is None


@pytest.fixture(scope="module")
def trl_grpo():
    """bench/trl_grpo.py's config mapping (it imports TRL itself only inside main, so this runs without it)."""
    return load("trl_grpo")


def test_trl_settings_follow_the_smollm2_recipe(trl_grpo):
    from asyncrl.core.config import load_config

    cfg = load_config(BENCH.parent / "configs" / "smollm2_word_problems.yaml")
    s = trl_grpo.settings(cfg)
    # 2 prompts x 8 per optimizer step, in micro-batches of 4; one update per generation
    assert (s["per_device_train_batch_size"], s["gradient_accumulation_steps"], s["steps_per_generation"], s["num_generations"]) == (4, 4, 4, 8)
    assert (s["learning_rate"], s["temperature"], s["max_completion_length"]) == (5e-4, 0.7, 160)
    assert s["mask_truncated_completions"] is True and s["loss_type"] == "dapo" and s["beta"] == 0.0
    lora = trl_grpo.peft_config(cfg, num_layers=30)
    assert (lora.r, lora.lora_alpha, lora.layers_to_transform) == (16, 32, list(range(22, 30)))
    assert set(lora.target_modules) == set(cfg.learner.lora.target_modules)


def test_trl_settings_follow_the_default_job(trl_grpo):
    from asyncrl.core.config import load_config

    cfg = load_config(BENCH.parent / "configs" / "default.yaml")
    s = trl_grpo.settings(cfg)
    assert (s["per_device_train_batch_size"], s["gradient_accumulation_steps"], s["steps_per_generation"]) == (64, 1, 1)
    assert (s["num_generations"], s["learning_rate"]) == (8, 1e-4)
    assert s["mask_truncated_completions"] is False and s["scale_rewards"] == "group"
    assert trl_grpo.peft_config(cfg, num_layers=2) is None  # full fine-tuning


def test_trl_settings_of_the_synchronous_baseline_generate_once_for_several_updates(trl_grpo):
    from asyncrl.core.config import load_config

    cfg = load_config(BENCH.parent / "configs" / "smollm2_word_problems_sync.yaml")
    s = trl_grpo.settings(cfg)  # 64 generated, then 4 updates of 16 in micro-batches of 4
    assert (s["per_device_train_batch_size"], s["gradient_accumulation_steps"], s["steps_per_generation"]) == (4, 4, 16)
    cfg.learner.micro_batch_size = 5
    with pytest.raises(ValueError, match="not a whole number of micro-batches of 5"):
        trl_grpo.settings(cfg)


def test_trl_settings_refuse_a_batch_that_is_not_whole_groups(trl_grpo):
    from asyncrl.core.config import load_config

    cfg = load_config(BENCH.parent / "configs" / "default.yaml")
    cfg.learner.batch_size = 60
    with pytest.raises(ValueError, match="not a whole number of groups"):
        trl_grpo.settings(cfg)


def test_trl_reward_scores_chat_completions_as_asyncrl_does(trl_grpo):
    reward = trl_grpo.make_reward_fn("numeric_match")
    chat = [[{"role": "assistant", "content": "3 + 4 = 7. Answer: 7"}], [{"role": "assistant", "content": "Answer: 8"}]]
    assert reward(prompts=[None, None], completions=chat, answer=["7", "7"]) == [1.0, 0.0]
    assert reward(prompts=[None], completions=["so 12"], answer=["12"]) == [1.0]


def test_length_cells_tell_percentiles_from_trl_means(vs_trl):
    mine = {"samples": 10, "mean": 40.2, "max": 160, "p50": 30, "p90": 120, "p99": 160, "finish_reasons": {"stop": 9, "length": 1}}
    assert vs_trl.lengths_cell(mine) == "p50 30 / p90 120 / p99 160 / max 160, mean 40, 10% cut"
    logs = [{"completions/mean_length": 30.0, "completions/max_length": 100.0, "completions/clipped_ratio": 0.0},
            {"completions/mean_length": 50.0, "completions/max_length": 160.0, "completions/clipped_ratio": 0.5}, {"loss": 1.0}]
    theirs = vs_trl.trl_lengths(logs)
    assert theirs == {"mean": 40.0, "max": 160.0, "cut": 0.25}
    assert vs_trl.lengths_cell(theirs).startswith("mean 40 / max 160")
    assert vs_trl.lengths_cell(None) == "–" and vs_trl.trl_lengths([{"loss": 1.0}]) is None


def test_curves_plot_every_side(vs_trl, tmp_path):
    sides = {"asyncrl": [{"step": 10, "train_s": 300.0, "accuracy": 0.45}, {"step": 0, "train_s": 0.0, "accuracy": 0.3}],
             "TRL": [{"step": 0, "train_s": 0.0, "accuracy": 0.3}]}
    vs_trl.plot_curves(sides, 0.4, "t", tmp_path / "c.png")
    assert (tmp_path / "c.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_trl_snapshots_stop_past_the_budget_and_leave_their_clock(trl_grpo, vs_trl, tmp_path):
    import json
    from types import SimpleNamespace

    import torch

    snaps = trl_grpo.Snapshots(tmp_path, every=10, samples_per_step=16, lora=False, max_s=0.0)
    model = torch.nn.Linear(2, 2)
    snaps.on_train_begin(None, None, None, model=model)
    control = SimpleNamespace(should_training_stop=False)
    snaps.on_step_end(None, SimpleNamespace(global_step=3, max_steps=60), control, model=model)
    assert control.should_training_stop and snaps.stopped_early
    saved = json.loads((tmp_path / "points.json").read_text())["points"]
    assert [p["step"] for p in saved] == [0, 3] and saved[1]["samples"] == 48  # the last step is snapshotted
    side = vs_trl.collect_trl(tmp_path, "cmd", None)  # no timeline.json: a run stopped from outside
    assert not side["finished"] and [p["step"] for p in side["points"]] == [0, 3]
    assert side["versions"]["trl"].endswith("(pinned)") and len(side["step_s"]) == 1


def test_reuse_refuses_runs_made_apart(vs_trl, tmp_path):
    for name in ("asyncrl", "trl"):
        (tmp_path / name).mkdir()
    with pytest.raises(SystemExit, match="did not come from one invocation"):
        vs_trl.same_invocation(tmp_path, ["asyncrl", "trl"])  # never stamped
    vs_trl.stamp(tmp_path, ["asyncrl", "trl"])
    vs_trl.same_invocation(tmp_path, ["asyncrl", "trl"])
    (tmp_path / "trl" / "invocation").write_text("another run")  # one side rerun alone
    with pytest.raises(SystemExit, match="did not come from one invocation"):
        vs_trl.same_invocation(tmp_path, ["asyncrl", "trl"])


def test_trl_schedule_trains_as_many_samples_as_asyncrls_steps(vs_trl):
    from asyncrl.core.config import load_config

    asyn = load_config(BENCH.parent / "configs" / "smollm2_word_problems.yaml")
    sync = load_config(BENCH.parent / "configs" / "smollm2_word_problems_sync.yaml")
    assert vs_trl.trl_schedule(asyn, asyn, 60, 10) == (60, 10)  # same job: same steps
    # TRL generating 64 and updating 4 x 16: 60 asyncrl steps of 16 are 60 updates (15 generations)
    assert vs_trl.trl_schedule(asyn, sync, 60, 10) == (60, 10)
    with pytest.raises(SystemExit, match="not whole TRL generations of 64"):
        vs_trl.trl_schedule(asyn, sync, 62, 10)
    tuned = load_config(BENCH.parent / "configs" / "smollm2_word_problems_sync.yaml", ["learner.lr=1e-3"])
    assert vs_trl.trl_schedule(asyn, tuned, 60, 10) == (60, 10)  # each side's learning rate is its own
    other = load_config(BENCH.parent / "configs" / "smollm2_word_problems_sync.yaml", ["rollout.temperature=1.0"])
    with pytest.raises(SystemExit, match="more than scheduling and the learning rate: rollout.temperature"):
        vs_trl.trl_schedule(asyn, other, 60, 10)


def test_sync_schedule_trains_as_many_samples_in_whole_generations(vs_trl):
    from asyncrl.core.config import load_config

    asyn = load_config(BENCH.parent / "configs" / "smollm2_word_problems.yaml")
    sync = load_config(BENCH.parent / "configs" / "smollm2_word_problems_sync.yaml")
    # 64 asyncrl steps of 16 samples are 16 synchronous steps of 64 (4 updates of 16 each); snapshots every 8 -> 2
    assert vs_trl.sync_schedule(asyn, sync, 64, 8) == (16, 2)
    with pytest.raises(SystemExit, match="multiples of 4"):
        vs_trl.sync_schedule(asyn, sync, 60, 10)
    tuned = load_config(BENCH.parent / "configs" / "smollm2_word_problems_sync.yaml", ["learner.lr=1e-3"])
    assert vs_trl.sync_schedule(asyn, tuned, 64, 8) == (16, 2)
    other = load_config(BENCH.parent / "configs" / "smollm2_word_problems_sync.yaml", ["task.steps=2"])
    with pytest.raises(SystemExit, match="synchronous job differs from asyncrl's in more than scheduling and the learning rate: task.steps"):
        vs_trl.sync_schedule(asyn, other, 64, 8)


def test_synchronous_points_are_numbered_in_asyncrl_steps(vs_trl):
    points = [{"step": 0, "train_s": 0.0, "samples": 0}, {"step": 2, "train_s": 40.0, "samples": 128}]
    assert vs_trl.in_asyncrl_steps(points, 4) == [{"step": 0, "learner_step": 0, "train_s": 0.0, "samples": 0},
                                                  {"step": 8, "learner_step": 2, "train_s": 40.0, "samples": 128}]


def _side(accuracies: list[float], seconds: list[float], **extra) -> dict:
    points = [{"step": 8 * i, "train_s": s, "samples": 128 * i, "accuracy": a} for i, (a, s) in enumerate(zip(accuracies, seconds))]
    return {"points": points, "step_s": [10.0, 9.0], "process_wall_s": 100.0, "response_lengths": None, **extra}


def test_table_has_a_column_and_a_ratio_for_the_synchronous_side(vs_trl):
    asyncrl = _side([0.2, 0.35, 0.5], [0.0, 100.0, 200.0], between_steps_s_total=1.0, own_eval_before=0.2, own_eval_after=0.5)
    sync = _side([0.2, 0.3, 0.45], [0.0, 150.0, 300.0])
    trl = _side([0.2, 0.25, 0.4], [0.0, 200.0, 400.0], versions={"trl": "1.16.0"})
    result = {"threshold": 0.4, "machine": {"nproc": 2, "cpu_model": "Test CPU", "load_avg_1m_at_start": 0.1}, "eval_size": 200,
              "split": "dev", "config": "configs/smollm2_word_problems.yaml", "sync_config": "configs/smollm2_word_problems_sync.yaml",
              "job": "a job", "steps": 16, "save_every": 8, "trl_threads": 2, "argv": ["--split", "dev"], "date": "2026-12-05",
              "asyncrl": asyncrl, "sync": sync, "trl_vllm": trl,
              "ratios_asyncrl_over": {k: vs_trl.ratios(asyncrl["points"], side["points"], 0.4) for k, side in (("sync", sync), ("trl_vllm", trl))}}
    text = vs_trl.render(result)
    assert "| | asyncrl | asyncrl, synchronous | TRL + vLLM colocate |" in text
    assert "asyncrl vs asyncrl, synchronous and TRL GRPOTrainer 1.16.0" in text
    assert "the synchronous side `smollm2_word_problems_sync.yaml`" in text
    assert "| seconds to accuracy ≥ 0.40 | 200.0 s (step 16) | 300.0 s (step 16) | 400.0 s (step 16) |" in text
    assert "asyncrl / asyncrl, synchronous: time to 0.40 **1.50x** faster" in text
    assert "asyncrl / TRL + vLLM colocate: time to 0.40 **2.00x** faster" in text


def test_trl_lora_snapshot_holds_the_merged_weights_a_sync_sends(trl_grpo, random_model_dir):
    """What TRL's snapshots hold with LoRA: asyncrl's sync names and merged values (base + scaling * B @ A), so one
    evaluator loads both sides' snapshots the same way."""
    import torch
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    from asyncrl.core.config import load_config
    from asyncrl.core.lora import sync_modules

    cfg = load_config(BENCH.parent / "configs" / "smollm2_word_problems.yaml", ["learner.lora.top_layers=1"])
    base = AutoModelForCausalLM.from_pretrained(random_model_dir, dtype=torch.float32)
    model = get_peft_model(base, trl_grpo.peft_config(cfg, base.config.num_hidden_layers))
    for name, p in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p)  # B starts at zero: make the adapter change the weights
    weights = trl_grpo.policy_weights(model, lora=True)
    assert list(weights) == [f"{m}.weight" for m in sync_modules(model)] and weights
    name = next(n for n in weights if n.endswith("q_proj.weight"))
    layer = model.get_submodule("base_model.model." + name.removesuffix(".weight"))
    a, b = layer.lora_A["default"].weight, layer.lora_B["default"].weight
    expected = layer.get_base_layer().weight + (b @ a) * layer.scaling["default"]
    assert torch.allclose(weights[name], expected, atol=1e-6)
    assert not weights[name].requires_grad


def test_resume_takes_the_sides_the_same_job_finished_and_runs_the_rest(vs_trl, tmp_path, monkeypatch):
    monkeypatch.setattr(vs_trl, "speed_probe", lambda: 0.25)
    ran = []

    def runner(key):
        def run(out: Path) -> dict:
            out.mkdir(parents=True)
            ran.append(key)
            return {"points": [{"step": 0, "train_s": 0.0, "path": None}, {"step": 8, "train_s": 9.0, "path": str(out / "s8")}]}
        return run

    plan = {k: (k, vs_trl.side_job(k, Path("c.yaml"), ["learner.lr=1e-3"], 64, 8), runner(k)) for k in ("asyncrl", "sync")}
    runs, resumed = vs_trl.run_sides(plan, tmp_path, resume=True)
    assert ran == ["asyncrl", "sync"] and resumed == [] and set(runs) == {"asyncrl", "sync"}

    (tmp_path / "sync" / "stray").write_text("from the stopped run")  # sync stopped part-way: no side.json
    (tmp_path / "sync" / vs_trl.SIDE_FILE).unlink()
    ran.clear()
    runs, resumed = vs_trl.run_sides(plan, tmp_path, resume=True)
    assert ran == ["sync"] and resumed == ["asyncrl"] and not (tmp_path / "sync" / "stray").exists()  # started afresh

    other = {**plan, "asyncrl": ("asyncrl", vs_trl.side_job("asyncrl", Path("c.yaml"), ["learner.lr=5e-4"], 64, 8), runner("asyncrl"))}
    ran.clear()
    vs_trl.run_sides(other, tmp_path, resume=True)  # another job in the same directory: nothing of it is taken
    assert ran == ["asyncrl"]
    ran.clear()
    vs_trl.run_sides(plan, tmp_path, resume=False)  # without resume every side runs
    assert ran == ["asyncrl", "sync"]


def test_a_scored_side_keeps_its_accuracies_only_for_the_same_snapshots(vs_trl, tmp_path):
    run = {"points": [{"step": 0, "path": None}, {"step": 8, "path": "s8"}]}
    kept = {"points": [dict(p) for p in run["points"]]}
    vs_trl.keep_side(tmp_path, "job", run, scored={"dev": [{"step": 0, "accuracy": 0.1}, {"step": 8, "accuracy": 0.3}]})
    assert vs_trl.scored_side(tmp_path, "test") is None
    scored = vs_trl.scored_side(tmp_path, "dev")
    assert vs_trl.take_scores(run, scored) and [p["accuracy"] for p in run["points"]] == [0.1, 0.3]
    other = {"points": [{"step": 0, "path": None}, {"step": 16, "path": "s16"}]}
    assert not vs_trl.take_scores(other, scored) and "accuracy" not in other["points"][1]
    assert vs_trl.kept_side(tmp_path, "job") == kept and vs_trl.kept_side(tmp_path, "another job") is None


def test_a_snapshot_of_the_initial_weights_is_recognised_so_its_score_is_not_computed_twice(vs_trl):
    import torch

    initial = {"a.weight": torch.randn(4, 3), "b.weight": torch.randn(2), "c.weight": torch.randn(5, 5)}
    assert vs_trl.holds_only({"a.weight": initial["a.weight"].clone(), "b.weight": initial["b.weight"].double()}, initial)
    moved = initial["a.weight"].clone()
    moved[1, 2] += 1e-6
    assert not vs_trl.holds_only({"a.weight": moved}, initial)
    assert not vs_trl.holds_only({"z.weight": torch.zeros(2)}, initial)  # a tensor the model does not have
    assert not vs_trl.holds_only({"c.weight": initial["c.weight"][:4]}, initial)  # another shape


def test_a_side_in_the_ledger_is_taken_on_a_fresh_machine_only_for_the_same_job(vs_trl, tmp_path, monkeypatch):
    monkeypatch.setattr(vs_trl, "speed_probe", lambda: 0.25)
    ran = []

    def run(out: Path) -> dict:
        out.mkdir(parents=True)
        ran.append(out.name)
        return {"points": [{"step": 0, "path": None}, {"step": 8, "path": str(out / "s8")}]}

    job = vs_trl.side_job("asyncrl", Path("c.yaml"), ["learner.lr=5e-4"], 64, 8)
    scored = [{"step": 0, "accuracy": 0.3}, {"step": 8, "accuracy": 0.4}]
    ledger = tmp_path / "ledger"
    ledger.mkdir()
    vs_trl.keep_side(ledger, job, {"points": [{"step": 0, "path": None}, {"step": 8, "path": "/gone/s8"}]}, scored={"dev": scored})
    (ledger / vs_trl.SIDE_FILE).rename(ledger / "asyncrl.json")

    work = tmp_path / "work"  # a fresh machine: no run directories
    runs, resumed = vs_trl.run_sides({"asyncrl": ("asyncrl", job, run)}, work, resume=True, ledger=ledger)
    assert ran == [] and resumed == ["asyncrl"]
    assert vs_trl.take_scores(runs["asyncrl"], vs_trl.scored_side(work / "asyncrl", "dev"))
    assert [p["accuracy"] for p in runs["asyncrl"]["points"]] == [0.3, 0.4]

    other = vs_trl.side_job("asyncrl", Path("c.yaml"), ["learner.lr=1e-3"], 64, 8)  # another rate: the ledger's is not it
    runs, resumed = vs_trl.run_sides({"asyncrl": ("asyncrl", other, run)}, tmp_path / "work2", resume=True, ledger=ledger)
    assert ran == ["asyncrl"] and resumed == []
    assert vs_trl.read_side(tmp_path / "work2" / "asyncrl")["machine"]["nproc"] >= 1  # where it ran is kept with it
    assert vs_trl.read_side(tmp_path / "work2" / "asyncrl")["machine"]["probe_s"] == [0.25, 0.25]  # its speed, before and after


def test_the_table_says_where_sides_made_in_other_invocations_ran(vs_trl):
    m = {"nproc": 2, "cpu_model": "Xeon A", "load_avg_1m_at_start": 0.1}
    same = {"resumed_sides": ["asyncrl", "sync"], "side_machines": {"asyncrl": m, "sync": {**m, "load_avg_1m_at_start": 1.5}}}
    assert "machines of one kind (Xeon A)" in vs_trl.machines_note(same) and "at load 1.5" in vs_trl.machines_note(same)
    mixed = {**same, "side_machines": {"asyncrl": m, "sync": {**m, "cpu_model": "EPYC B"}}}
    assert "different kinds" in vs_trl.machines_note(mixed) and "EPYC B" in vs_trl.machines_note(mixed)
    assert vs_trl.machines_note({**same, "resumed_sides": []}) == ""  # one invocation: the heading's machine is every side's
    assert vs_trl.machines_note({"resumed_sides": ["sync"]}) == ""  # a record from before sides kept their machine


def test_the_table_says_when_the_machines_speed_changed_between_sides(vs_trl):
    m = {"nproc": 2, "cpu_model": "Xeon A", "load_avg_1m_at_start": 0.1}
    steady = {"resumed_sides": ["asyncrl", "sync"],
              "side_machines": {"asyncrl": {**m, "probe_s": [0.20, 0.21]}, "sync": {**m, "probe_s": [0.21, 0.20]}}}
    assert vs_trl.probe_spread(steady["side_machines"]) == pytest.approx(1.05)
    assert "asyncrl 0.200/0.210, asyncrl, synchronous 0.210/0.200 (1.05x apart)" in vs_trl.machines_note(steady)
    slowed = {**steady, "side_machines": {**steady["side_machines"], "sync": {**m, "probe_s": [0.28, 0.29]}}}
    assert "1.45x apart: the machine's speed changed between sides" in vs_trl.machines_note(slowed)
    older = {**steady, "side_machines": {"asyncrl": m, "sync": {**m, "probe_s": [0.28, 0.29]}}}  # one side without a probe
    assert vs_trl.probe_spread(older["side_machines"]) is None and "probe" not in vs_trl.machines_note(older)


def test_the_speed_probe_times_a_fixed_workload(vs_trl):
    import torch

    threads = torch.get_num_threads()
    assert 0 < vs_trl.speed_probe(reps=1) < 60 and torch.get_num_threads() == threads  # the caller's threads are left as they were
