"""RolloutWorker, the Ray actor: one engine (vLLM or SGLang, rollout.engine) and the generation loop
(asyncrl.actors.rollout.loop) that drives it on a background thread. The other methods run on Ray's thread pool
and reach the loop only through its queues and events, so one thread at a time touches the engine.

Faults are counted drops, not crashes; every sample still ends in one status:

- A reward call that raises, or runs past `task.reward_timeout_s`, drops its group as dropped_error
  (`reward_errors`, `reward_timeouts`). With a reward pool (actors/reward.py) the call runs in a child process
  that is killed at the timeout, and a group whose reward actor died is handed over again. In the loop, rewards
  run the same way, in a child process of the worker (asyncrl.core.scoring.ScoringProcess), killed at the timeout:
  a reward that hangs on every call costs its samples, not the worker.
- When every sample of `task.max_consecutive_reward_failures` groups in a row fails scoring, the worker reports
  an error naming the reward and the last reason (the controller stops the run on any worker error).
- A prompt that is empty or too long for the engine becomes a group recorded as dropped_error without generating
  (`bad_prompts`); the loop goes on. A tool that times out ends its episode and drops its group.

A worker that reports an error (`stats().error`) stops its loop; what was still generating is recorded as
aborted by `stop()`.
"""
from __future__ import annotations

import dataclasses
import threading
import time

import ray

from asyncrl.actors.engines import make_engine
from asyncrl.actors.reward import RewardClient, reward_options
from asyncrl.actors.rollout.buffer_link import BufferLink
from asyncrl.actors.rollout.episodes import EpisodeMaker
from asyncrl.actors.rollout.flight import Flight
from asyncrl.actors.rollout.evaluation import EVAL_PREFIX  # noqa: F401 - part of this module's interface
from asyncrl.actors.rollout.loop import GenerationLoop
from asyncrl.actors.rollout.offline import episodes as offline_episodes
from asyncrl.actors.rollout.pool_scoring import PoolScoring
from asyncrl.actors.rollout.scoring import EnvironmentScoring, FailureStreak, InLoopScoring
from asyncrl.actors.rollout.state import Update
from asyncrl.actors.rollout.updates import POLICIES
from asyncrl.core.agent_host import AgentHost
from asyncrl.core.agents import AgentEnvironment
from asyncrl.core.config import Config
from asyncrl.core.deadlines import StageClock
from asyncrl.core.envs import make_environment
from asyncrl.core.evaluation import EvalScores
from asyncrl.core.messages import LoadReport, WorkerCounters, WorkerStats
from asyncrl.core.prompts import Prompt
from asyncrl.core.scoring import ScoringProcess
from asyncrl.core.tasks import make_task
from asyncrl.core.tools import ToolPool
from asyncrl.core.util import pin_to_cores
from asyncrl.core.weights import abandon_receives

class RolloutWorker:
    def __init__(self, worker_id: int, cfg: Config, model_path: str, buffer, run_id: str, start_cursor: int = 0,
                 first_group: int = 0, scorers: list | None = None) -> None:
        """`start_cursor`: prompts of this worker's stream to skip; `first_group`: its next group number (a
        replacement for a dead worker continues both where the buffer's admissions say it stopped); `scorers`: the
        reward pool's actors (none: score in the loop)."""
        pin_to_cores(cfg.rollout.cpu_affinity)
        import torch

        torch.set_num_threads(cfg.rollout.torch_threads)  # before the engine starts: its forward passes use them
        self.id, self.cfg = worker_id, cfg
        r, e = cfg.rollout, cfg.env
        env_cls = make_environment(e.name) if e.name else AgentEnvironment if e.agent else None
        stop = env_cls.stop if env_cls else ()
        self.engine = make_engine(  # an agent's requests may pass `stop`
            r.engine, model_path, cfg.model.dtype, cfg.model.max_model_len, cfg.run.seed + worker_id, r.kv_cache_gib, r.gpu_memory_utilization,
            priority=r.oldest_first, stop_strings=bool(stop) or bool(e.agent),
            tensor_parallel_size=r.tensor_parallel_size, cuda_graphs=r.cuda_graphs,  # GPU only (docs/engines-gpu.md)
        )
        self.engine.warm_up(self.engine.sampling_params(r.temperature, r.top_p, r.max_new_tokens, stop), self.engine.tokenizer("1+1=").input_ids)
        prompts = make_task(cfg.task, cfg.run.seed, cfg.data).train_prompts(seed=cfg.run.seed * 1000 + worker_id, start=start_cursor)
        self.agents = AgentHost(e.agent, e.tool_workers, e.agent_timeout_s, e.endpoint_port) if e.agent else None
        self.tools = self.agents or (ToolPool(e.name, e.tool_workers, e.tool_timeout_s) if env_cls and env_cls.tools else None)
        self.maker = EpisodeMaker(cfg, self.engine.tokenizer, env_cls, bool(e.agent))
        self.counters = WorkerCounters()
        wake = threading.Event()  # the loop's: an answered admission wakes it (`GenerationLoop.quiet`)
        self.link = BufferLink(buffer, worker_id, wake)
        streak = FailureStreak(cfg.task.max_consecutive_reward_failures, cfg.task.reward, lambda why: self.loop.fail(why))
        if scorers:
            clock = StageClock(cfg.run.hang_factor, cfg.run.hang_floor_s, cfg.run.hang_first_s)  # the watchdog on the reward actors
            self.scoring = PoolScoring(RewardClient(scorers, self.counters, self.link.put, streak, clock))
        elif env_cls is not None:
            self.scoring = EnvironmentScoring(self.link.put, streak, self.counters)
        else:
            scorer = ScoringProcess(cfg.task.reward, reward_options(cfg), cfg.task.reward_timeout_s)
            self.scoring = InLoopScoring(scorer, self.link.put, streak, self.counters)
        self.flight = Flight(self.engine, self.maker, self.scoring, self.link.put, self.tools, prompts, self.counters, run_id=run_id,
                             worker_id=worker_id, group_size=r.group_size, sampling=(r.temperature, r.top_p), first_group=first_group)
        self.loop = GenerationLoop(self.flight, self.link, POLICIES[r.weight_update], max_inflight=r.max_inflight_groups, keep_kv=r.keep_kv,
                                   verify=cfg.learner.verify_weights, wake=wake)
        self.stop_flag = threading.Event()
        self.thread: threading.Thread | None = None
        self.stopping = threading.Lock()  # stop() and retire() may come from two of Ray's threads at once

    # ---- lifecycle, called by the controller ----------------------------------------------

    def node_id(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def start(self) -> None:
        if self.thread is not None and self.thread.is_alive():
            return  # already generating (a joiner replaced during its first load is started by its replacement)
        self.thread = threading.Thread(target=self._run, name=f"rollout-{self.id}", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.loop.run(self.stop_flag)
        except Exception as exc:  # surfaced by stats(); the controller stops the run
            self.loop.error = f"rollout worker {self.id} loop failed: {exc!r}"
            raise

    def init_weight_sync(self, host: str, port: int, rank: int, world: int, transport: list, meta: list, bucket_bytes: int, name: str) -> bool:
        """Join the weight group `name` (again, after another worker was replaced: then between two engine steps)."""
        return self._through_loop(Update(self.loop.version, init_args=(host, port, rank, world, transport, meta, bucket_bytes, name)))

    def update_weights(self, version: int, payload=None) -> LoadReport:
        """Blocks until the loop has received and loaded `version` (between two engine steps; with drain, once nothing runs)."""
        t0 = time.monotonic()
        report = self._through_loop(Update(version, payload))
        return dataclasses.replace(report, wall_s=time.monotonic() - t0)

    def abandon_weights(self) -> int:
        """The learner gave up on the broadcast under way (another engine froze or died in it): this engine's receive
        fails now, not at the group's timeout (receivers in this process: vLLM's in-process engine, not SGLang's)."""
        return abandon_receives()

    def _through_loop(self, update: Update) -> object:
        """Have the loop thread apply `update` between two engine steps (or apply it here when no loop runs)."""
        thread = self.thread
        if thread is None or not thread.is_alive():
            self.loop.apply(update)
        else:
            self.loop.updates.append(update)
            self.loop.notify()
            while not update.done.wait(0.1):
                if not thread.is_alive():  # the loop ended (an error) before taking it: load here
                    self.loop.apply_queued()
        if update.error is not None:
            raise RuntimeError(update.error)
        return update.result

    def stats(self) -> WorkerStats:
        return WorkerStats(**dataclasses.asdict(self.counters), worker_id=self.id, version=self.loop.version,
                           inflight_groups=len(self.flight), scoring_groups=len(self.scoring),
                           error=self.loop.error)

    def engine_trace(self) -> list[tuple[float, int]]:
        """(wall time, running requests) of every engine step since the last call (the controller drains it each
        learner step into RUN_DIR/engine_trace.jsonl): where few requests run, the engine waits on the tail."""
        trace = self.loop.trace
        return [trace.popleft() for _ in range(len(trace))]  # deque: safe against the loop's appends

    def stop(self, reason: str = "run stopped while its group was generating") -> WorkerStats:
        """Stop the loop; in-flight samples are recorded as aborted_at_end with `reason`. Returns counters."""
        with self.stopping:
            self.stop_flag.set()
            self.loop.notify()
            if self.thread is not None:
                self.thread.join()
                self.thread = None
            records = self.loop.stop(self.link.release(), f"rollout worker {self.id} stopped during an evaluation", reason)
            if self.agents is not None:  # the agents still running are killed; the endpoint stays up (evaluation)
                self.agents.reset()
            records += self.scoring.finish(self.cfg.task.reward_timeout_s * 2 + 30)
            self.link.record_final(records)
            return self.stats()

    def retire(self, timeout_s: float) -> WorkerStats:
        """This worker leaves the pool (asyncrl scale, rollout.autoscale): it admits nothing more and goes on
        generating, scoring and delivering the groups it holds, for up to `timeout_s`; then it stops, and what it
        still held is recorded as aborted_at_end naming the removal. It keeps loading the weights it is sent
        meanwhile (it is in the weight group until the fleet re-forms it without this worker)."""
        self.loop.admitting = False
        deadline = time.monotonic() + timeout_s
        thread = self.thread
        while (thread is not None and thread.is_alive() and time.monotonic() < deadline
               and (len(self.flight) or len(self.scoring) or self.link.asking)):
            time.sleep(0.05)
        return self.stop(f"rollout worker {self.id} was removed from the pool before its group finished "
                         f"(rollout.retire_timeout_s={timeout_s:g})")

    # ---- evaluation and inspection ---------------------------------------------------------

    def evaluate(self, prompts: list[Prompt]) -> list[float]:
        """Each prompt's greedy score, in order (only while the loop is stopped): their mean is the accuracy."""
        assert self.thread is None, "evaluate needs the loop stopped"
        if self.maker.env_cls is not None:
            return [float(e["reward"]) for e in self.episodes(prompts, greedy=True)]
        outs = self.engine.greedy([self.maker.eval_ids(p) for p in prompts], self.cfg.rollout.max_new_tokens)
        return self.scoring.score_texts(prompts, [self.maker.decode(o) for o in outs])

    def evaluate_live(self, prompts: list[Prompt], samples: int = 0) -> EvalScores:
        """Validation during training, while the loop runs (asyncrl.actors.rollout.evaluation): each prompt's greedy
        score, length and truncation, and how many of `samples` responses at the rollout temperature score >=
        SOLVED, all by the version this worker holds (the controller publishes nothing until every worker answered)."""
        if self.maker.env_cls is not None:
            raise ValueError("evaluate_live evaluates single-turn tasks (env.name and env.agent unset)")
        thread = self.thread
        if thread is None or not thread.is_alive():
            raise RuntimeError(f"rollout worker {self.id}: evaluate_live needs the loop running ({self.loop.error or 'not started'})")
        job = self.loop.evals.new(prompts, samples)
        self.loop.notify()
        while not job.done.wait(0.1):
            if not thread.is_alive():
                raise RuntimeError(self.loop.error or f"rollout worker {self.id}: the loop stopped during an evaluation")
        if job.error is not None:
            raise ValueError(job.error)
        return job.scores(self.scoring.score_texts)

    def episodes(self, prompts: list[Prompt], greedy: bool = False) -> list[dict]:
        """Play one episode per prompt to its end (only while the loop is stopped), greedily or sampled as in
        training, through a generation loop of their own: prompt_ids, response_ids, loss_mask, behavior_logprobs,
        turns, reward, finish_reason and episode_end. Evaluation with env.name or env.agent, and tests."""
        assert self.thread is None and self.maker.env_cls is not None, "episodes needs env.name or env.agent and the loop stopped"
        return offline_episodes(self.loop, prompts, greedy)

    def sample(self, texts: list[str]) -> list[dict]:
        """One response per prompt text, sampled as in training (only while the loop is stopped): prompt_ids,
        response_ids, behavior_logprobs and finish_reason, for inspection and tests."""
        assert self.thread is None, "sample needs the loop stopped"
        prompts = [self.maker.encode(t) for t in texts]
        outs = self.engine.sample(prompts, self.flight.params)
        return [{"prompt_ids": p, "response_ids": o.token_ids, "behavior_logprobs": o.logprobs, "finish_reason": o.finish_reason}
                for p, o in zip(prompts, outs)]

    def sequence_logprobs(self, token_ids: list[int], temperature: float = 1.0) -> list[float]:
        assert self.thread is None, "sequence_logprobs needs the loop stopped"
        return self.engine.sequence_logprobs(token_ids, temperature)
