"""RolloutWorker: owns one engine (vLLM or SGLang, rollout.engine) and generates groups continuously.

A background thread runs the loop: apply a pending weight update, ask the
buffer to admit new groups (the staleness bound), add their requests, step the
engine, score finished groups and hand them to the buffer (or, with a reward pool, hand them to a reward
actor, which scores them and delivers them to the buffer, while the loop goes on). Other methods run
on Ray's thread pool and only talk to the loop through a queue and events, so
the engine is touched by one thread at a time.

A weight update lands between two engine steps; `rollout.weight_update` says
what becomes of the requests still generating then:

- keep: they go on under the new weights (re-prefilled), so a sample may span
  versions: `policy_version_start` < `policy_version_end`.
- abort: they are aborted and resubmitted from the prompt under the new
  version (same sample id), so every token of a sample comes from one
  version; the partial output is thrown away (`resubmitted` counts them).
- drain: the loop admits nothing new and steps until they have finished on
  the old weights, then loads (`drain_s` counts the wait; the learner's
  broadcast waits with it).
- resume (AReaL's partial rollouts): they are aborted, the tokens they had
  sampled are kept with their log-probs, and after the load each is
  resubmitted as prompt + those tokens with the remaining token budget, so the
  new version writes only what follows and nothing is generated twice
  (`resumed_tokens` counts the tokens kept). It needs only abort and add from
  an engine (an HTTP server would do), where keep needs in-place re-prefill.

With `env.name` a sample is a multi-turn episode (asyncrl.core.envs): each model turn is one engine request
whose input is the episode's exact tokens so far; a tool call it makes runs in the tool processes
(asyncrl.core.tools), never on this loop, and the observation is tokenised once and appended (loss mask 0)
before the next turn is submitted. Many episodes are in flight per engine. At an update, mid-episode: keep
lets the running turns go on; resume aborts them and continues them, keeping their tokens; abort restarts
every unfinished episode from its first turn with a fresh environment (same seed), so all its tokens come
from one version; drain waits until every episode in flight has ended (tool calls included). The reward is
the environment's; a tool that times out ends its episode and drops its group as dropped_error.

Every sample records the version that sampled each of its tokens
(`token_versions`; keep and resume can give two or more), and its
`policy_version_start` is its oldest token's (the request's start version when
it has no tokens), so staleness is judged by the oldest token. Within a group
start versions can differ (abort and resume resubmit only the unfinished
ones); the buffer judges a group by its oldest.

Faults are counted drops, not crashes; every sample still ends in one status:

- A reward call that raises, or runs past `task.reward_timeout_s`, drops its
  group as dropped_error (`reward_errors`, `reward_timeouts`). With a reward
  pool (actors/reward.py) the call runs in a child process that is killed at
  the timeout, and a group whose reward actor died is handed over again
  (RewardClient). In the loop, rewards run on
  a few daemon threads (asyncrl.core.tasks.RewardRunner) and the loop waits for each
  call up to the timeout; a timed-out call cannot be killed and keeps its
  thread, so once all of them are held the worker reports an error.
- When every sample of `task.max_consecutive_reward_failures` groups in a row
  fails scoring, the worker reports an error naming the reward and the last
  reason (the controller stops the run on any worker error).
- A prompt that is empty or too long for the engine becomes a group recorded
  as dropped_error without generating (`bad_prompts`); the loop goes on.

A worker that reports an error (`stats().error`) stops its loop; what was
still generating is recorded as aborted by `stop()`.
"""
from __future__ import annotations

import dataclasses
import queue
import threading
import time
import zlib
from collections import deque
from dataclasses import dataclass, field

import ray

from asyncrl.actors.engine import Finished
from asyncrl.actors.engines import make_engine
from asyncrl.actors.reward import SCORING_CHECK_S, RewardClient
from asyncrl.core.config import Config
from asyncrl.core.agents import AgentEnvironment, AgentHost, AgentRun
from asyncrl.core.envs import EpisodeLimits, EpisodeRun, make_environment, observation_ids
from asyncrl.core.messages import GroupId, LoadReport, WorkerCounters, WorkerStats, group_of
from asyncrl.core.schema import Status, new_sample
from asyncrl.core.reward_traits import per_sample
from asyncrl.core.tools import ToolPool
from asyncrl.core.evaluation import SOLVED, EvalScores
from asyncrl.core.tasks import Prompt, RewardRunner, RewardThreadsStuck, RewardTimeout, encode_prompt, make_reward, make_task
from asyncrl.core.util import pin_to_cores


@dataclass
class _Group:
    gid: GroupId
    prompt: Prompt
    prompt_ids: list[int]
    t_submitted: float
    starts: dict[str, int] = field(default_factory=dict)  # sample_id -> version its current request started at
    done: dict[str, tuple[Finished, int, float]] = field(default_factory=dict)  # sample_id -> (out, version, t)
    prefix: dict[str, Finished] = field(default_factory=dict)  # sample_id -> tokens kept from aborted requests (resume)
    versions: dict[str, list[int]] = field(default_factory=dict)  # sample_id -> version of each token sampled before the last update (an episode: of its current turn)
    episodes: dict[str, EpisodeRun] = field(default_factory=dict)  # sample_id -> its episode (env.name)
    attempts: dict[str, int] = field(default_factory=dict)  # sample_id -> restarts of its episode (abort): older tool outcomes are dropped

    @property
    def group_id(self) -> str:
        return str(self.gid)


@dataclass
class _Update:
    version: int
    payload: object = None  # what the learner's end of the weight transport sent with the version (broadcast: None)
    init_args: tuple | None = None  # (re)join the weight group instead of loading weights (after a worker restart)
    done: threading.Event = field(default_factory=threading.Event)
    result: object = None  # a LoadReport, or for a join whether every engine worker joined
    error: str | None = None


EVAL_PREFIX = "asyncrl-eval-"
"""Request ids of validation requests (`evaluate_live`): the loop hands their outputs to their evaluation, never to a group."""


@dataclass
class _Eval:
    """Held-out problems the loop generates next to the training requests: one greedy response each, and `samples`
    sampled at the rollout temperature. The loop thread encodes, submits and decodes (the tokenizer stays on that
    thread); the caller scores the responses."""
    prompts: list[Prompt]
    samples: int
    number: int  # this worker's evaluation count: request ids asyncrl-eval-<number>-<problem>-<g | s<j>>
    responses: dict[str, tuple[str, int, bool]] = field(default_factory=dict)  # request id -> (text, tokens, truncated)
    done: threading.Event = field(default_factory=threading.Event)
    error: str | None = None

    def requests(self) -> list[tuple[str, int, bool]]:
        """(request id, problem index, greedy) of each request, problem by problem, the greedy one first."""
        return [(f"{EVAL_PREFIX}{self.number}-{i}-{kind}", i, kind == "g") for i in range(len(self.prompts))
                for kind in ["g", *(f"s{j}" for j in range(self.samples))]]


TRACE_LIMIT = 200_000
"""Engine steps kept between two drains, the newest (a stalled controller must not grow the worker without bound)."""

ADMIT_WAIT_S = 1.0
"""Longest the buffer holds an admission call that it cannot grant yet (it answers as soon as it can): one call a
second while the worker waits, instead of one every few milliseconds."""

IDLE_WAIT_S = 0.005
"""With nothing to run, how long the loop waits for an admission answer before it looks at its queues again: a
weight update, a validation or a tool's outcome waits at most this long to be taken."""

REWARD_THREADS = 4
"""Threads per worker for reward calls; a timed-out call holds one until it returns (see RewardRunner)."""


class RolloutWorker:
    def __init__(
        self, worker_id: int, cfg: Config, model_path: str, buffer, run_id: str, start_cursor: int = 0, first_group: int = 0,
        scorers: list | None = None,
    ) -> None:
        """`start_cursor`: prompts of this worker's stream to skip; `first_group`: its next group number
        (a replacement for a dead worker continues both where the buffer's admissions say it stopped);
        `scorers`: the reward pool's actors (none: score in this loop)."""
        pin_to_cores(cfg.rollout.cpu_affinity)
        import torch

        torch.set_num_threads(cfg.rollout.torch_threads)  # before the engine starts: its forward passes use them
        self.id, self.cfg, self.buffer, self.run_id = worker_id, cfg, buffer, run_id
        r, e = cfg.rollout, cfg.env
        self.env_cls = make_environment(e.name) if e.name else AgentEnvironment if e.agent else None
        self.stop_strings = self.env_cls.stop if self.env_cls else ()
        self.engine = make_engine(  # an agent's requests may pass `stop`
            r.engine, model_path, cfg.model.dtype, cfg.model.max_model_len, cfg.run.seed + worker_id, r.kv_cache_gib, r.gpu_memory_utilization,
            priority=r.oldest_first, stop_strings=bool(self.stop_strings) or bool(e.agent),
            tensor_parallel_size=r.tensor_parallel_size, cuda_graphs=r.cuda_graphs,  # GPU only (docs/engines-gpu.md)
        )
        self.params = self.engine.sampling_params(r.temperature, r.top_p, r.max_new_tokens, self.stop_strings)
        self.engine.warm_up(self.params, self.engine.tokenizer("1+1=").input_ids)
        task = make_task(cfg.task, cfg.run.seed, cfg.data)
        self.prompts = task.train_prompts(seed=cfg.run.seed * 1000 + worker_id, start=start_cursor)
        timeout_s = cfg.task.reward_timeout_s
        self.tools = ToolPool(e.name, e.tool_workers, e.tool_timeout_s) if self.env_cls and self.env_cls.tools else None
        self.agents = AgentHost(e.agent, e.tool_workers, e.agent_timeout_s, e.endpoint_port) if e.agent else None
        if self.agents is not None:  # the loop drives agent episodes as tool calls: see asyncrl.core.agents
            self.tools = self.agents
        self.limits = EpisodeLimits(e.max_turns, e.max_episode_tokens, r.max_new_tokens)
        self.eos_ids = frozenset(i for i in (self.engine.tokenizer.eos_token_id,) if i is not None)
        self.ready: set[str] = set()  # episodes whose next turn is due (submitted by the loop, never from inside a collect)
        self.reward = None if scorers or self.env_cls else RewardRunner(per_sample(make_reward(cfg.task.reward)), timeout_s, REWARD_THREADS, f"reward-w{worker_id}")
        self.max_reward_failures = cfg.task.max_consecutive_reward_failures
        self.reward_failures = 0  # groups in a row whose every sample failed scoring
        self.version = 0
        self.error: str | None = None
        self.inflight: dict[str, _Group] = {}
        self.updates: queue.Queue[_Update] = queue.Queue()
        self.eval_jobs: queue.Queue[_Eval] = queue.Queue()  # validations for the loop to submit (evaluate_live)
        self.evals: dict[str, _Eval] = {}  # request id -> its validation, while it generates
        self.evals_started = 0
        self.stop_flag = threading.Event()
        self.thread: threading.Thread | None = None
        self.counters = WorkerCounters()
        self.pool = RewardClient(scorers, self.counters, self._put, self._count_reward_failures) if scorers else None
        self.pending_puts: list = []
        self.trace: deque[tuple[float, int]] = deque(maxlen=TRACE_LIMIT)  # (wall time, requests in the engine) per engine step
        self.admission = None  # the buffer.admit call in flight, if any
        self.next_group = first_group
        self.max_prompt = cfg.model.max_model_len - (e.max_episode_tokens if self.env_cls else r.max_new_tokens)

    # ---- called by the controller -------------------------------------------------

    def node_id(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def init_weight_sync(self, host: str, port: int, rank: int, world: int, transport: list, meta: list, bucket_bytes: int) -> bool:
        """Join the weight group (again, after another worker was replaced: then between two engine steps)."""
        update = _Update(self.version, init_args=(host, port, rank, world, transport, meta, bucket_bytes))
        return self._through_loop(update)

    def start(self) -> None:
        self.thread = threading.Thread(target=self._loop, name=f"rollout-{self.id}", daemon=True)
        self.thread.start()

    def update_weights(self, version: int, payload=None) -> LoadReport:
        """Blocks until the loop has received and loaded `version` (between two engine steps; with drain, once nothing runs)."""
        return self._through_loop(_Update(version, payload))

    def _through_loop(self, update: _Update) -> object:
        """Have the loop thread apply `update` between two engine steps (or apply it here when no loop runs)."""
        thread = self.thread
        if thread is None or not thread.is_alive():
            self._apply(update)
        else:
            self.updates.put(update)
            while not update.done.wait(0.1):
                if not thread.is_alive():  # the loop ended (an error) before taking it: load here, as for a loop already ended
                    self._apply_queued()
        if update.error is not None:
            raise RuntimeError(update.error)
        return update.result

    def stats(self) -> WorkerStats:
        return WorkerStats(**dataclasses.asdict(self.counters), worker_id=self.id, version=self.version,
                           inflight_groups=len(self.inflight), scoring_groups=len(self.pool) if self.pool is not None else 0,
                           reward_threads_stuck=self.reward.stuck if self.reward else 0, error=self.error)

    def stop(self) -> WorkerStats:
        """Stop the loop; in-flight samples are recorded as aborted. Returns counters."""
        self.stop_flag.set()
        if self.thread is not None:
            self.thread.join()
            self.thread = None
        if self.admission is not None:  # groups admitted as the loop stopped: started and recorded as aborted with the rest
            self.buffer.release.remote(self.id)  # a call still waiting in the buffer answers 0 at once
            self._start_groups(ray.get(self.admission))
            self.admission = None
        self._end_evals(f"rollout worker {self.id} stopped during an evaluation")
        self._keep_partial(self._abort(list(self._request_ids())))  # recorded with the aborted samples
        records = [s for g in self.inflight.values() for s in self._abort_records(g)]
        self.inflight.clear()
        if self.agents is not None:  # the agents still running are killed; the endpoint stays up (evaluation)
            self.agents.reset()
        if self.pool is not None:
            records += self.pool.finish(self.cfg.task.reward_timeout_s * 2 + 30)
        ray.get(self.pending_puts + [self.buffer.record_final.remote(records)])
        self.pending_puts = []
        return self.stats()

    def evaluate(self, prompts: list[Prompt]) -> list[float]:
        """Each prompt's greedy score, in order (only while the loop is stopped): their mean is the accuracy."""
        assert self.thread is None, "evaluate needs the loop stopped"
        if self.env_cls is not None:
            return [float(e["reward"]) for e in self.episodes(prompts, greedy=True)]
        ids = [self._eval_ids(p, p.content) for p in prompts]
        outs = self.engine.greedy(ids, self.cfg.rollout.max_new_tokens)
        responses = [self._decode(o) for o in outs]
        return self._score_texts(prompts, responses)

    def _score_texts(self, prompts: list[Prompt], responses: list[str]) -> list[float]:
        """Each (prompt, response)'s score by the task's reward: in the reward pool when there is one."""
        if not responses:
            return []
        if self.pool is not None:
            return ray.get(self.pool.scorers[0].score_texts.remote(prompts, responses))
        return [self.reward(p, r) for p, r in zip(prompts, responses)]

    def evaluate_live(self, prompts: list[Prompt], samples: int = 0) -> EvalScores:
        """Validation during training, while the loop runs: each prompt's greedy score, length and truncation, and how many
        of `samples` responses at the rollout temperature score >= SOLVED, all by the version this worker holds.

        Why next to the training requests and not with the loop paused: the engine steps every request it holds, so
        a paused loop would either leave the training requests unstepped (generation stalls for the whole evaluation)
        or, through a blocking generate, step them and swallow their outputs. Submitted by the loop as ordinary
        requests, the evaluation's share the engine's batches with training, and their outputs, recognised by their
        ids, go back here, never to a group: nothing reaches the buffer, admission and the counters are untouched.
        The version stays the one evaluated because the controller publishes nothing until every worker answered."""
        if self.env_cls is not None:
            raise ValueError("evaluate_live evaluates single-turn tasks (env.name and env.agent unset)")
        thread = self.thread
        if thread is None or not thread.is_alive():
            raise RuntimeError(f"rollout worker {self.id}: evaluate_live needs the loop running ({self.error or 'not started'})")
        job = _Eval(prompts, samples, self.evals_started)
        self.evals_started += 1
        self.eval_jobs.put(job)
        while not job.done.wait(0.1):
            if not thread.is_alive():
                raise RuntimeError(self.error or f"rollout worker {self.id}: the loop stopped during an evaluation")
        if job.error is not None:
            raise ValueError(job.error)
        return self._eval_scores(job)

    def _eval_scores(self, job: _Eval) -> EvalScores:
        """Score a finished evaluation's responses (on the caller's thread: the loop goes on meanwhile)."""
        greedy = [job.responses[rid] for rid, _, is_greedy in job.requests() if is_greedy]
        sampled = [job.responses[rid][0] for rid, _, is_greedy in job.requests() if not is_greedy]
        scores = self._score_texts(job.prompts, [text for text, _, _ in greedy])
        sample_scores = self._score_texts([p for p in job.prompts for _ in range(job.samples)], sampled)
        solved = [sum(s >= SOLVED for s in sample_scores[i * job.samples:(i + 1) * job.samples]) for i in range(len(job.prompts))]
        return EvalScores(greedy=scores, greedy_tokens=[n for _, n, _ in greedy], greedy_truncated=[cut for _, _, cut in greedy],
                          solved=solved, samples=job.samples)

    def _eval_ids(self, prompt: Prompt, text: str) -> list[int]:
        try:
            return self._encode(text)
        except BadPrompt as exc:  # a bad eval prompt is an error, not a drop
            raise ValueError(f"eval prompt {prompt.prompt_id!r}: {exc}") from exc

    def episodes(self, prompts: list[Prompt], greedy: bool = False) -> list[dict]:
        """Play one episode per prompt to its end (only while the loop is stopped), greedily or sampled as in
        training: prompt_ids, response_ids, loss_mask, behavior_logprobs, turns, reward, finish_reason and
        episode_end. Evaluation with env.name, and tests."""
        assert self.thread is None and self.env_cls is not None, "episodes needs env.name and the loop stopped"
        r = self.cfg.rollout
        runs: dict[str, EpisodeRun | AgentRun] = {}
        for i, p in enumerate(prompts):
            rid = f"asyncrl-episode-{i}"
            if self.agents is not None:  # its agent's requests come through the endpoint, as in training
                runs[rid] = self._agent_run(rid)
                self.agents.start(rid, rid, p)
                continue
            env = self._environment(p, rid)
            runs[rid] = self._episode_run(env, self._eval_ids(p, env.start()))
        temperature = 0.0 if greedy else r.temperature

        def submit(rid: str) -> None:
            run = runs[rid]
            self.engine.add(rid, run.episode.next_input(), self.engine.sampling_params(temperature, r.top_p, run.turn_budget(), run.stop))

        for rid in runs:
            if self.agents is None:
                submit(rid)
        while not all(run.done for run in runs.values()):
            due = []
            for out in self.engine.step():
                run = runs[out.request_id]
                call = run.model_turn(out.token_ids, out.logprobs, [self.version] * len(out.token_ids))
                if call is not None:
                    self.tools.submit(out.request_id, call.name, call.argument)
                elif not run.done:
                    due.append(out.request_id)
            for outcome in self.tools.poll() if self.tools is not None else []:
                if outcome.key not in runs:  # a training episode's call, left running when the loop stopped
                    continue
                run = runs[outcome.key]
                run.tool_done(outcome.result) if outcome.error is None else run.tool_failed(outcome.error)
                if not run.done:
                    due.append(outcome.key)
            for rid in due:
                submit(rid)
            if not self.engine.has_unfinished():
                time.sleep(0.005)
        for rid, run in runs.items():  # an agent still asking after its episode ended is answered 404
            if self.agents is not None:
                self.agents.forget(rid, run.end.reason)
        return [self._episode_fields(run) for run in runs.values()]

    def sample(self, texts: list[str]) -> list[dict]:
        """One response per prompt text, sampled as in training (only while the loop is stopped): prompt_ids,
        response_ids, behavior_logprobs and finish_reason, for inspection and tests."""
        assert self.thread is None, "sample needs the loop stopped"
        prompts = [self._encode(t) for t in texts]
        outs = self.engine.sample(prompts, self.params)
        return [{"prompt_ids": p, "response_ids": o.token_ids, "behavior_logprobs": o.logprobs, "finish_reason": o.finish_reason}
                for p, o in zip(prompts, outs)]

    def sequence_logprobs(self, token_ids: list[int], temperature: float = 1.0) -> list[float]:
        assert self.thread is None, "sequence_logprobs needs the loop stopped"
        return self.engine.sequence_logprobs(token_ids, temperature)

    # ---- the loop -----------------------------------------------------------------

    def _loop(self) -> None:
        try:
            self._run_loop()
        except Exception as exc:  # surfaced by stats(); the controller stops the run
            self.error = f"rollout worker {self.id} loop failed: {exc!r}"
            raise

    def _fail(self, message: str) -> None:
        """Report an error (stats().error, which stops the run) and end the loop after the current step."""
        if self.error is None:
            self.error = f"rollout worker {self.id}: {message}"

    def _run_loop(self) -> None:
        """`loop_s` is the loop's wall time: engine steps (`busy_s`), waiting with nothing to run (`idle_s`),
        weight updates (`update_s`) and the rest, asyncrl's own work (admission calls, scoring, hand-off)."""
        started = time.monotonic()
        try:
            self._loop_steps()
        finally:
            self.counters.loop_s += time.monotonic() - started

    def _loop_steps(self) -> None:
        next_admit = next_check = 0.0
        while not self.stop_flag.is_set() and self.error is None:
            while not self.updates.empty():
                self._apply(self.updates.get())
            while not self.eval_jobs.empty():
                self._start_eval(self.eval_jobs.get())
            next_admit = self._admit(next_admit)
            self._advance_episodes()
            if self.pool is not None and time.monotonic() >= next_check:
                self.pool.check()
                next_check = time.monotonic() + SCORING_CHECK_S
            if self.engine.has_unfinished():
                self._step()
            else:
                t0 = time.monotonic()
                if self.admission is not None:
                    ray.wait([self.admission], timeout=IDLE_WAIT_S)
                else:
                    self.stop_flag.wait(0.005)
                self.counters.idle_s += time.monotonic() - t0

    def _admit(self, next_admit: float) -> float:
        """Start the groups of an answered admission call, and ask for more when there is room; returns when to ask
        next. The call is not waited for (at most one in flight): the engine steps meanwhile."""
        if self.admission is not None:
            if not ray.wait([self.admission], timeout=0)[0]:
                return next_admit
            admitted = ray.get(self.admission)
            self.admission = None
            self._start_groups(admitted)
            next_admit = time.monotonic() + (0.0 if admitted else 0.005)
        room = self.cfg.rollout.max_inflight_groups - len(self.inflight)  # only grows until the answer is in
        if room > 0 and time.monotonic() >= next_admit:
            self.admission = self.buffer.admit.remote(room, self.id, self.version, ADMIT_WAIT_S)
        return next_admit

    def _advance_episodes(self) -> None:
        """Hand the tool outcomes that came in to their episodes, and submit the turns that are due."""
        if self.tools is not None:
            for outcome in self.tools.poll():
                self._tool_outcome(outcome)
        due, self.ready = self.ready, set()
        for sample_id in sorted(due):
            group = self.inflight.get(group_of(sample_id))
            if group is not None and sample_id not in group.done:
                self._submit(group, sample_id)

    def _tool_outcome(self, outcome) -> None:
        if not isinstance(outcome.key, tuple):  # an evaluation episode's (episodes())
            return
        sample_id, attempt = outcome.key
        group = self.inflight.get(group_of(sample_id))
        if group is None or group.attempts.get(sample_id, 0) != attempt or sample_id in group.done:
            return  # its episode was restarted (weight_update=abort) or recorded since
        run = group.episodes[sample_id]
        self.counters.tool_calls += 1
        self.counters.tool_s += outcome.seconds
        if outcome.error is None:
            run.tool_done(outcome.result)
        else:
            self.counters.tool_errors += 1
            run.tool_failed(outcome.error)
        self._turn_ended(group, sample_id, run)

    def _episodes_waiting(self) -> bool:
        """Episodes between two turns: a tool call running or a turn due."""
        return bool(self.ready) or (self.tools is not None and self.tools.pending() > 0)

    def engine_trace(self) -> list[tuple[float, int]]:
        """(wall time, running requests) of every engine step since the last call (the controller drains it each
        learner step into RUN_DIR/engine_trace.jsonl): where few requests run, the engine waits on the tail."""
        return [self.trace.popleft() for _ in range(len(self.trace))]  # deque: safe against the loop's appends

    def _step(self) -> None:
        self.trace.append((time.time(), self.engine.num_unfinished()))
        t0 = time.monotonic()
        finished = self._eval_outputs(self.engine.step())
        self.counters.busy_s += time.monotonic() - t0
        self._collect(finished)

    def _start_eval(self, job: _Eval) -> None:
        """Submit a validation's requests next to the training ones (their priority: the newest version's, so with
        rollout.oldest_first they queue behind nothing older than the groups just admitted)."""
        try:
            ids = [self._eval_ids(p, p.content) for p in job.prompts]
        except ValueError as exc:
            job.error = str(exc)
            job.done.set()
            return
        r = self.cfg.rollout
        greedy = self.engine.sampling_params(0.0, 1.0, r.max_new_tokens)
        for rid, problem, is_greedy in job.requests():
            self.evals[rid] = job
            self.engine.add(rid, ids[problem], greedy if is_greedy else self.params, priority=self.version)
        if not job.prompts:
            job.done.set()

    def _eval_outputs(self, finished: list[Finished]) -> list[Finished]:
        """Hand the validation requests' outputs to their evaluation (decoded here, on the loop's thread); returns the rest."""
        rest = []
        for out in finished:
            job = self.evals.pop(out.request_id, None)
            if job is None:
                rest.append(out)
                continue
            job.responses[out.request_id] = (self._decode(out.token_ids), len(out.token_ids), out.finish_reason == "length")
            if len(job.responses) == len(job.prompts) * (1 + job.samples):
                job.done.set()
        return rest

    def _end_evals(self, why: str) -> None:
        """Abort the validations still generating (the loop stopped); their callers get `why`."""
        jobs = {id(job): job for job in self.evals.values()}
        self.engine.abort(list(self.evals))
        self.evals.clear()
        for job in jobs.values():
            job.error = why
            job.done.set()

    def _apply_queued(self) -> None:
        while True:
            try:
                update = self.updates.get_nowait()
            except queue.Empty:
                return
            self._apply(update)

    def _apply(self, update: _Update) -> None:
        try:
            if update.init_args is not None:
                update.result = all(self.engine.init_weight_sync(*update.init_args))
            else:
                update.result = self._update(update.version, update.payload)
        except Exception as exc:  # reported to the caller of update_weights, which fails the run
            update.error = f"weight update failed on worker {self.id}: {exc!r}"
        update.done.set()

    def _update(self, version: int, payload=None) -> LoadReport:
        """Load `version`; running requests are kept, aborted and resubmitted, or drained first (rollout.weight_update)."""
        mode = self.cfg.rollout.weight_update
        started = time.monotonic()
        if mode == "drain":
            self._drain()
        with self.engine.paused():  # nothing generates from here until the new weights are in
            running = list(self._request_ids())
            if mode == "keep":  # they go on; what they sampled so far is the old version's
                for sample_id in running:
                    self._note_versions(sample_id, self.engine.generated(sample_id))
            elif mode == "abort":
                running = [out.request_id for out in self._abort(running)]
                for sample_id in running:
                    self.inflight[group_of(sample_id)].versions.pop(sample_id, None)
                running = sorted(set(running) | self._restart_episodes())
            elif mode == "resume":
                partial = self._abort(running)
                running = [out.request_id for out in partial]
                self._keep_partial(partial)
                self.counters.resumed_tokens += sum(len(out.token_ids) for out in partial)
            t0 = time.monotonic()
            nbytes = self.engine.receive_weights(payload, keep_kv=self.cfg.rollout.keep_kv)
            self.version = version
            self.counters.weight_updates += 1
            self.buffer.loaded.remote(self.id, version)  # an admission waiting for these weights may go on
        self._resubmit(running if mode in ("abort", "resume") else [])
        self.counters.update_s += time.monotonic() - started
        return LoadReport(version=version, seconds=time.monotonic() - t0, bytes=nbytes)

    def _restart_episodes(self) -> set[str]:
        """weight_update=abort: every unfinished episode starts again from its first turn, with a fresh environment
        of the same seed (a running tool call's outcome is dropped when it comes); returns their sample ids."""
        restarted = set()
        for group in self.inflight.values():
            for sample_id, run in group.episodes.items():
                if sample_id in group.done or not run.episode.turns:
                    continue
                group.attempts[sample_id] = group.attempts.get(sample_id, 0) + 1
                group.episodes[sample_id] = self._new_episode(group, sample_id)
                group.prefix.pop(sample_id, None)
                group.versions.pop(sample_id, None)
                self.ready.discard(sample_id)
                restarted.add(sample_id)
        return restarted

    def _drain(self) -> None:
        """Step until every running request has finished on the current weights; nothing is admitted meanwhile.

        `drain_s` adds up only these steps: it stays 0 while updates find the engine idle."""
        while self.engine.has_unfinished() or self._episodes_waiting():  # episodes: until every one in flight ended
            t0 = time.monotonic()
            self._advance_episodes()
            if self.engine.has_unfinished():
                self._step()
            else:
                time.sleep(0.005)
            self.counters.drain_s += time.monotonic() - t0

    def _note_versions(self, sample_id: str, generated: int) -> None:
        """The sample's tokens up to `generated` in its current request (after its kept prefix) were sampled by
        the current version."""
        group = self.inflight[group_of(sample_id)]
        versions = group.versions.setdefault(sample_id, [])
        kept = len(group.prefix[sample_id].token_ids) if sample_id in group.prefix else 0
        versions.extend([self.version] * (kept + generated - len(versions)))

    def _abort(self, request_ids: list[str]) -> list[Finished]:
        """Abort these requests; returns the partial outputs. One the engine had finished before the abort reached
        it (SGLang runs between polls) is collected as finished, never resumed past its end."""
        outs = self.engine.abort(request_ids)
        self._collect([out for out in outs if out.finish_reason != "abort"])
        return [out for out in outs if out.finish_reason == "abort"]

    def _keep_partial(self, partial: list[Finished]) -> None:
        """Append what aborted requests had sampled to their samples' kept prefix (resume; at stop, for the record)."""
        for out in partial:
            group = self.inflight[group_of(out.request_id)]
            self._note_versions(out.request_id, len(out.token_ids))
            group.prefix[out.request_id] = _joined(group.prefix.get(out.request_id), out)

    def _resubmit(self, sample_ids: list[str]) -> None:
        """Start aborted samples again under the current version: from their prompt (abort), or from prompt + the
        tokens they kept (resume)."""
        for sample_id in sample_ids:
            self._submit(self.inflight[group_of(sample_id)], sample_id)
        self.counters.resubmitted += len(sample_ids)

    def _start_groups(self, n: int) -> None:
        """Start `n` admitted groups; a bad prompt's group is recorded as dropped_error instead (it still fills its admission)."""
        for _ in range(n):
            prompt = next(self.prompts)
            self.counters.prompts_drawn += 1
            group = _Group(GroupId(self.run_id, self.id, self.next_group), prompt, [], time.time())
            self.next_group += 1
            try:
                group.prompt_ids = self._encode(self.env_cls(prompt, 0).start() if self.env_cls else prompt.content)
            except BadPrompt as exc:
                self.counters.bad_prompts += 1
                self._put(self._bad_prompt_records(group, str(exc)))
                continue
            self.inflight[group.group_id] = group
            self.counters.groups_started += 1
            for i in range(self.cfg.rollout.group_size):
                sample_id = group.gid.sample_id(i)
                if self.env_cls is not None:
                    group.episodes[sample_id] = self._new_episode(group, sample_id)
                if self.agents is not None:  # its first turn waits for the agent's first request
                    group.starts[sample_id] = self.version
                    self.agents.start((sample_id, 0), sample_id, prompt)
                else:
                    self._submit(group, sample_id)

    def _new_episode(self, group: _Group, sample_id: str) -> EpisodeRun | AgentRun:
        """A sample's episode from its first turn; its environment's seed is the run's and the sample id's (a
        restart replays the same environment). With env.agent: an episode its agent drives, id the sample's."""
        if self.agents is not None:
            return self._agent_run(sample_id)
        return self._episode_run(self._environment(group.prompt, sample_id), group.prompt_ids)

    def _agent_run(self, episode_id: str) -> AgentRun:
        tokenizer = self.engine.tokenizer
        return AgentRun(episode_id, self.limits, lambda messages: encode_prompt(tokenizer, messages, True),
                        lambda messages, after_eos: observation_ids(tokenizer, messages, True, after_eos),
                        self._decode, tokenizer.convert_ids_to_tokens, self.eos_ids, self.max_prompt)

    def _environment(self, prompt: Prompt, key: str):
        """`prompt`'s environment, seeded by the run's seed and `key` (a sample id, or an evaluation episode's)."""
        return self.env_cls(prompt, seed=self.cfg.run.seed * 1_000_003 + zlib.crc32(key.encode()))

    def _episode_run(self, env, prompt_ids: list[int]) -> EpisodeRun:
        tokenizer, chat = self.engine.tokenizer, self.cfg.task.chat
        return EpisodeRun(env, prompt_ids, self.limits, lambda text, after_eos: observation_ids(tokenizer, text, chat, after_eos),
                          self._decode, self.eos_ids)

    def _submit(self, group: _Group, sample_id: str) -> None:
        """Add the sample's request: its prompt (an episode: its tokens so far), then whatever it kept from earlier
        requests (resume), with the token budget that is left."""
        run = group.episodes.get(sample_id)
        base = group.prompt_ids if run is None else run.episode.next_input()
        budget = self.cfg.rollout.max_new_tokens if run is None else run.turn_budget()
        kept = group.prefix.get(sample_id)
        sampled = (run.episode.sampled_versions() if run is not None else []) + group.versions.get(sample_id, [])
        if not sampled:
            group.starts[sample_id] = self.version
        oldest = sampled[0] if sampled else self.version  # served oldest first (rollout.oldest_first)
        kept_ids = kept.token_ids if kept is not None else []
        left = budget - len(kept_ids)
        if left <= 0:  # it had used its whole budget when it was stopped: it is finished
            self._collect([Finished(sample_id, [], [], "length")])
            return
        self.engine.add(sample_id, base + kept_ids, self._params(left, self.stop_strings if run is None else run.stop), priority=oldest)

    def _params(self, max_tokens: int, stop: tuple[str, ...]):
        if max_tokens == self.cfg.rollout.max_new_tokens and stop == self.stop_strings:
            return self.params
        r = self.cfg.rollout
        return self.engine.sampling_params(r.temperature, r.top_p, max_tokens, stop)

    def _collect(self, finished: list[Finished]) -> None:
        for out in finished:
            group = self.inflight[group_of(out.request_id)]
            self.counters.tokens += len(out.token_ids)
            self.counters.turns += 1
            self._note_versions(out.request_id, len(out.token_ids))
            out = _joined(group.prefix.pop(out.request_id, None), out)
            run = group.episodes.get(out.request_id)
            if run is None:
                self._sample_done(group, out)
                continue
            versions = group.versions.pop(out.request_id, [])[: len(out.token_ids)]
            call = run.model_turn(out.token_ids, out.logprobs, versions)
            if call is not None:
                self.tools.submit((out.request_id, group.attempts.get(out.request_id, 0)), call.name, call.argument)
            else:
                self._turn_ended(group, out.request_id, run)

    def _turn_ended(self, group: _Group, sample_id: str, run: EpisodeRun) -> None:
        """After a model turn (with no tool to wait for) or a tool's outcome: the episode's next turn is due, or it ended."""
        if not run.done:
            self.ready.add(sample_id)
            return
        ep = run.episode
        if self.agents is not None:  # ended before its agent returned (a limit, a bad request): its agent is told so
            self.agents.forget((sample_id, 0), run.end.reason)
        self._sample_done(group, Finished(sample_id, ep.response_ids, ep.behavior_logprobs, run.finish_reason))

    def _sample_done(self, group: _Group, out: Finished) -> None:
        group.done[out.request_id] = (out, self.version, time.time())
        if len(group.done) == self.cfg.rollout.group_size:
            del self.inflight[group.group_id]
            self.counters.groups_done += 1
            if self.pool is not None:
                self.pool.hand_off(self._group_records(group), group.prompt)
            else:
                self._put(self._score(group))

    def _put(self, records: list[dict]) -> None:
        """Hand a group to the buffer; past 64 unacknowledged puts, wait for them."""
        self.pending_puts.append(self.buffer.put.remote(records))
        if len(self.pending_puts) > 64:
            ray.get(self.pending_puts)
            self.pending_puts = []

    def _group_records(self, group: _Group) -> list[dict]:
        """A finished group's records, by sample id, not yet scored."""
        return [self._record(group, sample_id, out.token_ids, out.logprobs, version_end, t_gen, out.finish_reason)
                for sample_id, (out, version_end, t_gen) in sorted(group.done.items())]

    def _score(self, group: _Group) -> list[dict]:
        records, failed = self._group_records(group), []
        for record in records:
            reason = None
            run = group.episodes.get(record["sample_id"])
            try:
                if run is not None:  # the environment's reward; a tool that timed out or died drops the group
                    reason = run.end.reason if run.finish_reason == "tool_error" else None
                    record["reward"] = None if reason else run.end.reward
                else:
                    record["reward"] = self.reward(group.prompt, record["response_text"])
            except RewardThreadsStuck as exc:  # no reward can run any more: this worker is done
                reason = str(exc)
                self._fail(f"reward {self.cfg.task.reward!r}: {exc}")
            except RewardTimeout as exc:
                reason = str(exc)
                self.counters.reward_timeouts += 1
            except Exception as exc:  # a user reward failing must not kill the worker
                reason = f"reward raised {exc!r}"
                self.counters.reward_errors += 1
            if reason is not None:
                failed.append(reason)
                record.update(status=Status.DROPPED_ERROR.value, status_reason=reason)
            record["t_scored"] = time.time()
        if failed:  # GRPO needs whole groups: one failure drops the group
            for r in records:
                r.update(status=Status.DROPPED_ERROR.value, status_reason=r["status_reason"] or "a sample of its group failed")
        self._count_reward_failures(len(failed) == len(records), failed[-1] if failed else "")
        return records

    def _count_reward_failures(self, all_failed: bool, reason: str) -> None:
        """Stop the run once `task.max_consecutive_reward_failures` groups in a row had every sample fail scoring."""
        self.reward_failures = self.reward_failures + 1 if all_failed else 0
        if self.reward_failures >= self.max_reward_failures:
            self._fail(f"reward {self.cfg.task.reward!r} failed for the last {self.reward_failures} groups: {reason}")

    def _bad_prompt_records(self, group: _Group, reason: str) -> list[dict]:
        """A group that never generates: every sample dropped_error with `reason`."""
        records = []
        for i in range(self.cfg.rollout.group_size):
            group.starts[group.gid.sample_id(i)] = self.version
            record = self._record(group, group.gid.sample_id(i), [], [], self.version, None, None)
            record.update(status=Status.DROPPED_ERROR.value, status_reason=reason, t_scored=time.time())
            records.append(record)
        return records

    def _record(self, group: _Group, sample_id: str, ids: list[int], lps: list[float], version_end, t_gen, reason) -> dict:
        """`version_end`: the version when it ended. A finished sample's end is its last token's version (SGLang may
        have finished it by itself before an update the worker saw first)."""
        run = group.episodes.get(sample_id)
        if run is None:
            versions = sampled = group.versions.get(sample_id, [])[: len(ids)]
            episode = {}
        else:  # `ids` are the episode's response tokens, observations included (version -1)
            versions, sampled = run.episode.token_versions, run.episode.sampled_versions()
            episode = {k: v for k, v in self._episode_fields(run).items() if k in ("loss_mask", "turns", "episode_end")}
        start = sampled[0] if sampled else group.starts[sample_id]  # the oldest token's version
        if sampled and reason != "abort":
            version_end = sampled[-1]
        return new_sample(
            **episode, run_id=self.run_id, sample_id=sample_id, group_id=group.group_id, prompt_id=group.prompt.prompt_id,
            worker_id=self.id, prompt_text=group.prompt.text, prompt_ids=run.episode.prompt_ids if run else group.prompt_ids, response_ids=ids,
            response_text=self._decode(ids), behavior_logprobs=lps, finish_reason=reason,
            policy_version_start=start, policy_version_end=version_end, token_versions=versions,
            t_submitted=group.t_submitted, t_generated=t_gen,
        )

    def _episode_fields(self, run: EpisodeRun) -> dict:
        ep = run.episode
        return {
            "prompt_ids": ep.prompt_ids, "response_ids": ep.response_ids, "loss_mask": ep.loss_mask,
            "behavior_logprobs": ep.behavior_logprobs, "token_versions": ep.token_versions,
            "turns": [dataclasses.asdict(t) for t in ep.turns], "reward": run.end.reward if run.end else None,
            "finish_reason": run.finish_reason, "episode_end": run.end.reason if run.end else None,
        }

    def _abort_records(self, group: _Group) -> list[dict]:
        records = []
        for i in range(self.cfg.rollout.group_size):
            sample_id = group.gid.sample_id(i)
            run = group.episodes.get(sample_id)
            partial = (Finished(sample_id, run.episode.response_ids, run.episode.behavior_logprobs, "abort") if run is not None  # its whole turns
                       else group.prefix.get(sample_id) or Finished(sample_id, [], [], "abort"))
            out, version_end, t_gen = group.done.get(sample_id, (partial, self.version, None))
            record = self._record(group, sample_id, out.token_ids, out.logprobs, version_end, t_gen, out.finish_reason)
            record.update(status=Status.ABORTED_AT_END.value, status_reason="run stopped while its group was generating")
            records.append(record)
        return records

    def _request_ids(self):
        """The samples with a request in the engine (not an episode waiting for a tool or its next turn)."""
        for group in self.inflight.values():
            for i in range(self.cfg.rollout.group_size):
                sample_id = group.gid.sample_id(i)
                run = group.episodes.get(sample_id)
                if sample_id not in group.done and (run is None or (run.pending is None and sample_id not in self.ready and not run.done)):
                    yield sample_id

    def _encode(self, text: str | list[dict]) -> list[int]:
        """The prompt's token ids (`text`: a prompt, or an environment's opening chat messages); BadPrompt when it is
        empty or leaves no room for `rollout.max_new_tokens` (an episode: `env.max_episode_tokens`)."""
        if not (text.strip() if isinstance(text, str) else text):
            raise BadPrompt("empty prompt")
        ids = encode_prompt(self.engine.tokenizer, text, self.cfg.task.chat)
        if not ids:
            raise BadPrompt("prompt encodes to 0 tokens")
        if len(ids) > self.max_prompt:
            raise BadPrompt(
                f"prompt encodes to {len(ids)} tokens; the limit is {self.max_prompt} (model.max_model_len - "
                f"{'env.max_episode_tokens' if self.env_cls else 'rollout.max_new_tokens'})"
            )
        return ids

    def _decode(self, ids: list[int]) -> str:
        return self.engine.tokenizer.decode(ids, skip_special_tokens=True)


def _joined(kept: Finished | None, out: Finished) -> Finished:
    """The tokens and log-probs a sample kept from aborted requests, then `out`'s (with out's finish reason)."""
    if kept is None:
        return out
    return Finished(out.request_id, kept.token_ids + out.token_ids, kept.logprobs + out.logprobs, out.finish_reason)


class BadPrompt(ValueError):
    """A prompt the engine cannot take; the message says why."""
