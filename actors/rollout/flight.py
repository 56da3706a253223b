"""The samples in flight on one engine: groups started, each sample's request submitted with its episode's tokens
so far, finished turns handed to their episodes, tool outcomes taken, and an ended group's records handed off.

Every sample is an episode (asyncrl.core.episode): a single-turn sample has one model turn; an environment's
alternates model turns with tool calls run off the loop (asyncrl.core.tools) and observations appended token in /
token out; an agent's turns are its requests to the endpoint (asyncrl.core.agents). Every token records the
version that sampled it (`token_versions`; keep and resume can give two or more per sample), and a sample's start
version is its oldest token's, so staleness is judged by the oldest token; the buffer judges a group by its
oldest sample."""
from __future__ import annotations

import time

from asyncrl.actors.engine import Finished
from asyncrl.actors.rollout.episodes import BadPrompt, EpisodeMaker
from asyncrl.actors.rollout.records import bad_prompt_records, sample_record
from asyncrl.actors.rollout.scoring import Scoring
from asyncrl.actors.rollout.state import Group, SampleState
from asyncrl.core.messages import GroupId, WorkerCounters, group_of


class Flight:
    """`version`: the weights the engine holds now (the loop sets it at each load). `tools`: a ToolPool, an
    AgentHost (env.agent) or None; `put`: the buffer hand-off of a bad prompt's group; `sampling`: (temperature, top_p)."""

    def __init__(self, engine, maker: EpisodeMaker, scoring: Scoring, put, tools, prompts, counters: WorkerCounters, *,
                 run_id: str, worker_id: int, group_size: int, sampling: tuple[float, float], first_group: int = 0) -> None:
        self.engine, self.maker, self.scoring, self.put, self.tools, self.prompts = engine, maker, scoring, put, tools, prompts
        self.counters, self.run_id, self.worker_id, self.group_size = counters, run_id, worker_id, group_size
        self.temperature, self.top_p = sampling
        self.next_group, self.version = first_group, 0
        self.stop_strings = maker.env_cls.stop if maker.env_cls else ()
        self.params = self._params(maker.limits.turn_tokens, self.stop_strings, cached=False)
        self.groups: dict[str, Group] = {}
        self.ready: set[str] = set()  # samples whose next turn is due (submitted by `advance`, never from inside a collect)

    def __len__(self) -> int:
        return len(self.groups)

    def start_groups(self, n: int, strict: bool = False) -> None:
        """Start `n` admitted groups; a bad prompt's group is recorded as dropped_error instead (it still fills its
        admission), or with `strict` raises ValueError (an evaluation's prompt)."""
        for _ in range(n):
            prompt = next(self.prompts)
            self.counters.prompts_drawn += 1
            group = Group(GroupId(self.run_id, self.worker_id, self.next_group), prompt, [])
            self.next_group += 1
            if strict:  # an evaluation's prompt: a bad one is an error, not a drop
                group.prompt_ids = self.maker.eval_ids(prompt, self.maker.opening(prompt))
            else:
                try:
                    group.prompt_ids = self.maker.encode(self.maker.opening(prompt))
                except BadPrompt as exc:
                    self.counters.bad_prompts += 1
                    self.put(bad_prompt_records(self.run_id, self.worker_id, group, self.group_size, self.version, str(exc)))
                    continue
            self.groups[group.group_id] = group
            self.counters.groups_started += 1
            for i in range(self.group_size):
                sample_id = group.gid.sample_id(i)
                state = group.samples[sample_id] = SampleState(sample_id, self.maker.new(prompt, group.prompt_ids, sample_id), self.version)
                if self.maker.agent:  # its first turn waits for the agent's first request
                    self.tools.start((sample_id, 0), sample_id, prompt)
                else:
                    self.submit(state)

    def sample(self, sample_id: str) -> SampleState:
        return self.groups[group_of(sample_id)].samples[sample_id]

    def submit(self, state: SampleState) -> None:
        """Add the sample's request: its episode's tokens so far, then what it kept from aborted requests of this turn
        (resume), with the token budget left."""
        driver = state.driver
        if not state.sampled_versions():
            state.start = self.version
        kept = state.kept.token_ids if state.kept is not None else []
        left = driver.turn_budget() - len(kept)
        if left <= 0:  # it had used its whole budget when it was stopped: the turn is finished
            self.collect([Finished(state.sample_id, [], [], "length")])
            return
        self.engine.add(state.sample_id, driver.episode.next_input() + kept, self._params(left, driver.stop), priority=state.oldest(self.version))

    def _params(self, max_tokens: int, stop: tuple[str, ...], cached: bool = True):
        if cached and max_tokens == self.maker.limits.turn_tokens and stop == self.stop_strings:
            return self.params
        return self.engine.sampling_params(self.temperature, self.top_p, max_tokens, stop)

    def collect(self, finished: list[Finished]) -> None:
        """Hand each finished turn to its episode: a tool call goes to the tools, an ended episode ends its sample."""
        for out in finished:
            state = self.sample(out.request_id)
            self.counters.tokens += len(out.token_ids)
            self.counters.turns += 1
            self.note_versions(out.request_id, len(out.token_ids))
            out, state.kept = _joined(state.kept, out), None
            versions, state.versions = state.versions[: len(out.token_ids)], []
            call = state.driver.model_turn(out.token_ids, out.logprobs, versions, out.finish_reason)
            if call is not None:
                self.tools.submit((out.request_id, state.attempt), call.name, call.argument)
            else:
                self.turn_ended(state)

    def advance(self) -> None:
        """Hand the tool outcomes that came in to their episodes, and submit the turns that are due."""
        if self.tools is not None:
            for outcome in self.tools.poll():
                self.tool_outcome(outcome)
        due, self.ready = self.ready, set()
        for sample_id in sorted(due):
            group = self.groups.get(group_of(sample_id))
            if group is not None and not group.samples[sample_id].done:
                self.submit(group.samples[sample_id])

    def tool_outcome(self, outcome) -> None:
        sample_id, attempt = outcome.key
        group = self.groups.get(group_of(sample_id))
        state = group.samples.get(sample_id) if group is not None else None
        if state is None or state.attempt != attempt or state.done:
            return  # another loop's (an offline run's), or its episode was restarted (abort) or recorded since
        self.counters.tool_calls += 1
        self.counters.tool_s += outcome.seconds
        if outcome.error is None:
            state.driver.tool_done(outcome.result)
        else:
            self.counters.tool_errors += 1
            state.driver.tool_failed(outcome.error)
        self.turn_ended(state)

    def turn_ended(self, state: SampleState) -> None:
        """After a model turn with no tool to wait for, or a tool's outcome: the next turn is due, or it ended."""
        driver = state.driver
        if not driver.done:
            self.ready.add(state.sample_id)
            return
        if self.maker.agent:  # ended before its agent returned (a limit, a bad request): its agent is told so
            self.tools.forget((state.sample_id, 0), driver.end.reason)
        state.ended = (self.version, time.time())
        group = self.groups[group_of(state.sample_id)]
        if group.finished:
            del self.groups[group.group_id]
            self.counters.groups_done += 1
            self.scoring.hand_off(group, self.records(group))

    def records(self, group: Group) -> list[dict]:
        return [sample_record(self.run_id, self.worker_id, group, group.samples[sid], self.maker.decode) for sid in sorted(group.samples)]

    def running(self):
        """The samples with a request in the engine (not an episode waiting for a tool or its next turn)."""
        for group in self.groups.values():
            for sample_id, state in group.samples.items():
                if not state.done and state.driver.pending is None and sample_id not in self.ready and not state.driver.done:
                    yield sample_id

    def waiting(self) -> bool:
        """Episodes between two turns: a tool call running or a turn due."""
        return bool(self.ready) or (self.tools is not None and self.tools.pending() > 0)

    def note_versions(self, sample_id: str, generated: int) -> None:
        """The sample's tokens up to `generated` in its current request (after what it kept) were sampled by the
        current version."""
        state = self.sample(sample_id)
        kept = len(state.kept.token_ids) if state.kept is not None else 0
        state.versions.extend([self.version] * (kept + generated - len(state.versions)))

    def keep_partial(self, partial: list[Finished]) -> None:
        """Keep what aborted requests had sampled, after what their samples kept before (resume; at stop)."""
        for out in partial:
            self.note_versions(out.request_id, len(out.token_ids))
            state = self.sample(out.request_id)
            state.kept = _joined(state.kept, out)

    def restart_episodes(self) -> set[str]:
        """Every unfinished episode past its first turn starts again from it, with a fresh environment of the same
        seed (a running tool call's outcome is dropped when it comes); returns their sample ids."""
        restarted = set()
        for group in self.groups.values():
            for sample_id, state in group.samples.items():
                if state.done or not state.driver.episode.turns:
                    continue
                state.attempt += 1
                state.driver = self.maker.new(group.prompt, group.prompt_ids, sample_id)
                state.kept, state.versions = None, []
                self.ready.discard(sample_id)
                restarted.add(sample_id)
        return restarted


def _joined(kept: Finished | None, out: Finished) -> Finished:
    """The tokens and log-probs a sample kept from aborted requests, then `out`'s (with out's finish reason)."""
    if kept is None:
        return out
    return Finished(out.request_id, kept.token_ids + out.token_ids, kept.logprobs + out.logprobs, out.finish_reason)
