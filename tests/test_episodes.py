"""Multi-turn episodes (env.name) through the real rollout worker, engine and trajectory store.

A stepped worker (its own actor, the loop run by hand) plays episodes of `tests.envs_fixture.ScriptedEnv` on the
untrained tiny model, keeping every output its engine handed back: the stored tokens of each episode are exactly
the engine's sampled turns plus the observation tokens, the loss mask is 1 on exactly the sampled ones, and the
learner's log-probs of the whole episode agree with the engine's behaviour log-probs at every sampled token.
End to end, a tool that hangs is killed at env.tool_timeout_s and its group recorded with the reason, with no
tool process left once the run is over (SIGKILL and --resume with episodes in flight: tests/test_checkpoint.py).
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import ray
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from asyncrl.actors.buffer import ReplayBuffer
from asyncrl.actors.engines import engine_runtime_env
from asyncrl.actors.rollout.worker import RolloutWorker
from asyncrl.core.batching import collate, token_logprobs
from asyncrl.core.config import load_config
from asyncrl.core.chat import observation_ids
from asyncrl.core.store import read_trajectories
from tests.test_e2e import run_smoke
from tests.test_reward_pool import scoring_children
from tests.test_weight_update import ENGINES, ray_session  # noqa: F401 - a fixture

SCRIPTED = ("env.name=tests.envs_fixture.ScriptedEnv", "env.max_episode_tokens=40", "rollout.max_new_tokens=8")
LOGPROB_TOL = 2e-3


class SteppedEpisodes(RolloutWorker):
    """A RolloutWorker whose loop the test runs by hand, keeping what the engine returned per sample."""

    def play(self, groups: int) -> dict[str, list]:
        seen: dict[str, list] = {}
        step = self.engine.step

        def recorded():
            outs = step()
            for out in outs:
                seen.setdefault(out.request_id, []).append((out.token_ids, out.logprobs, out.finish_reason))
            return outs

        self.engine.step = recorded
        self.flight.start_groups(groups)
        while self.flight.groups:
            self.flight.advance()
            if self.engine.has_unfinished():
                self.loop.step()
            else:
                time.sleep(0.005)
        self.link.flush()
        return seen


@pytest.fixture(scope="module", params=ENGINES)
def played(request, random_model_dir, ray_session, tmp_path_factory):  # noqa: F811
    engine = request.param
    store = tmp_path_factory.mktemp(f"episodes_{engine}")
    cfg = load_config(None, [f"rollout.engine={engine}", "rollout.group_size=4", *SCRIPTED])
    buffer = ray.remote(ReplayBuffer).remote(cfg, str(store))
    worker = ray.remote(SteppedEpisodes).options(num_cpus=1, runtime_env=engine_runtime_env(engine, on_gpu=False)).remote(
        0, cfg, random_model_dir, buffer, "t")
    seen = ray.get(worker.play.remote(3))
    ray.get(worker.stop.remote())
    ray.get(buffer.close.remote())
    ray.kill(worker)
    return read_trajectories(store).to_pylist(), seen


@pytest.mark.slow
def test_stored_tokens_are_the_engines_sampled_turns_plus_the_observation_tokens(played, random_model_dir):
    rows, seen = played
    tok = AutoTokenizer.from_pretrained(random_model_dir)
    assert len(rows) == 12 and len({r["sample_id"] for r in rows}) == 12
    for r in rows:
        turns = r["turns"]
        assert [t["role"] for t in turns] == ["model", "observation", "model", "observation", "model"]
        assert turns[0]["tool"] == "tool" and turns[1]["text"] == "21" and turns[3]["text"] == "34"
        assert r["episode_end"] == "scripted end" and r["finish_reason"] == "stop" and r["reward"] in (0.0, 1.0)
        engine_turns = seen[r["sample_id"]]  # one engine output per model turn, in order
        model = [t for t in turns if t["role"] == "model"]
        assert len(engine_turns) == len(model) == 3
        ids, lps, mask = r["response_ids"], r["behavior_logprobs"], r["loss_mask"]
        assert turns[0]["start"] == 0 and turns[-1]["end"] == len(ids) == len(lps) == len(mask) == len(r["token_versions"])
        for t, (sampled, logprobs, _) in zip(model, engine_turns):
            assert ids[t["start"]:t["end"]] == sampled  # exactly the tokens the engine sampled
            assert lps[t["start"]:t["end"]] == pytest.approx(logprobs, abs=1e-6)  # float32 in the store
            assert mask[t["start"]:t["end"]] == [1] * len(sampled) and set(r["token_versions"][t["start"]:t["end"]]) <= {0}
        for prev, t in zip(turns, turns[1:]):
            if t["role"] == "observation":  # tokenised once, after the turn: closed by an EOS when the model's was not
                closed = ids[prev["end"] - 1] == tok.eos_token_id
                assert ids[t["start"]:t["end"]] == observation_ids(tok, t["text"], chat=False, after_eos=closed)
                assert mask[t["start"]:t["end"]] == [0] * (t["end"] - t["start"])
                assert set(r["token_versions"][t["start"]:t["end"]]) == {-1} and set(lps[t["start"]:t["end"]]) == {0.0}


@pytest.mark.slow
def test_the_learner_recomputes_the_behaviour_logprobs_of_whole_episodes(played, random_model_dir):
    rows, _ = played
    model = AutoModelForCausalLM.from_pretrained(random_model_dir, torch_dtype=torch.float32)
    batch = collate([{**r, "reward": r["reward"] or 0.0} for r in rows], pad_id=0)
    assert batch.response_mask.sum().item() == sum(sum(r["loss_mask"]) for r in rows)  # the loss sees only sampled tokens
    with torch.no_grad():
        learner, _ = token_logprobs(model, batch, temperature=1.0)
    gap = ((learner - batch.behavior_logprobs).abs() * batch.response_mask).max().item()
    assert gap < LOGPROB_TOL, f"engine and learner disagree on an episode's sampled tokens by {gap:.4f}"


@pytest.mark.slow
def test_a_hung_tool_is_killed_at_its_timeout_and_its_group_recorded_with_the_reason(random_model_dir, tmp_path):
    out = tmp_path / "run"
    run_smoke(out, random_model_dir, "run.steps=3", "run.eval=false", "env.name=tests.envs_fixture.SometimesHangingEnv",
              "env.max_episode_tokens=40", "rollout.max_new_tokens=8", "env.tool_timeout_s=1", "env.tool_workers=2")
    rows = read_trajectories(out / "trajectories").to_pylist()
    assert len(rows) == len({r["sample_id"] for r in rows})
    timed_out = [r for r in rows if r["finish_reason"] == "tool_error"]
    assert timed_out, "no episode's tool hung (the fixture hangs about one in six)"
    for r in timed_out:
        assert r["status"] in ("dropped_error", "aborted_at_end")
        assert "tool 'tool' timed out after 1 s (env.tool_timeout_s; its process was killed)" in r["episode_end"]
    dropped = {r["group_id"] for r in timed_out if r["status"] == "dropped_error"}
    assert dropped and all(r["status"] == "dropped_error" for r in rows if r["group_id"] in dropped)  # whole groups
    summary = json.loads(Path(out / "summary.json").read_text())
    assert summary["samples"]["consumed"] == 3 * 16 and summary["rollout"][0]["tool_errors"] >= len(dropped)
    assert scoring_children(out) == [], "a tool process outlived its run"


@pytest.mark.slow
def test_sglang_ends_model_turns_at_the_environments_stop_string(random_model_dir, ray_session, tmp_path):  # noqa: F811
    """SGLang matches stop strings on detokenized text, so an environment with stop strings starts its tokenizer
    (skip_tokenizer_init=False): each turn ends at its first "3" and keeps every token it sampled."""
    cfg = load_config(None, ["rollout.engine=sglang", "rollout.group_size=4", "env.name=tests.envs_fixture.StoppingEnv",
                             "env.max_episode_tokens=40", "rollout.max_new_tokens=8"])
    buffer = ray.remote(ReplayBuffer).remote(cfg, str(tmp_path))
    worker = ray.remote(SteppedEpisodes).options(num_cpus=1, runtime_env=engine_runtime_env("sglang", on_gpu=False)).remote(
        0, cfg, random_model_dir, buffer, "t")
    try:
        seen = ray.get(worker.play.remote(2))
        ray.get(worker.stop.remote())
        ray.get(buffer.close.remote())
    finally:
        ray.kill(worker)
    rows = read_trajectories(tmp_path).to_pylist()
    tok = AutoTokenizer.from_pretrained(random_model_dir)
    turns = [(t, r) for r in rows for t in r["turns"] if t["role"] == "model"]
    assert len(rows) == 8 and len(turns) == 24
    for t, r in turns:
        text = tok.decode(r["response_ids"][t["start"]:t["end"]], skip_special_tokens=True)
        assert "3" not in text[:-1], f"a turn went on past its stop string: {text!r}"
    stopped = [t for t, _ in turns if t["text"].endswith("3")]
    assert stopped, "no turn stopped at the stop string"
    assert all(len(outs) == 3 for outs in seen.values())  # every sampled turn came back from the engine
