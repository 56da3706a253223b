"""Validation while the loop runs (RolloutWorker.evaluate_live): held-out problems generated next to the training
requests, one greedy response each and `samples` at the rollout temperature.

Why next to the training requests and not with the loop paused: the engine steps every request it holds, so a
paused loop would either leave the training requests unstepped (generation stalls for the whole evaluation) or,
through a blocking generate, step them and swallow their outputs. Submitted by the loop as ordinary requests, the
evaluation's share the engine's batches with training, and their outputs, recognised by their ids, go back to the
evaluation, never to a group: nothing reaches the buffer, admission and the counters are untouched."""
from __future__ import annotations

import queue
import threading
from dataclasses import dataclass, field
from typing import Callable

from asyncrl.actors.engine import Finished
from asyncrl.core.evaluation import SOLVED, EvalScores
from asyncrl.core.prompts import Prompt

EVAL_PREFIX = "asyncrl-eval-"
"""Request ids of validation requests: the loop hands their outputs to their evaluation, never to a group."""


@dataclass
class EvalJob:
    """The loop thread encodes, submits and decodes (the tokenizer stays on that thread); the caller scores."""

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

    def scores(self, score_texts: Callable[[list[Prompt], list[str]], list[float]]) -> EvalScores:
        """Score the finished evaluation's responses (on the caller's thread: the loop goes on meanwhile)."""
        greedy = [self.responses[rid] for rid, _, is_greedy in self.requests() if is_greedy]
        sampled = [self.responses[rid][0] for rid, _, is_greedy in self.requests() if not is_greedy]
        scores = score_texts(self.prompts, [text for text, _, _ in greedy])
        sample_scores = score_texts([p for p in self.prompts for _ in range(self.samples)], sampled)
        k = self.samples
        solved = [sum(s >= SOLVED for s in sample_scores[i * k:(i + 1) * k]) for i in range(len(self.prompts))]
        return EvalScores(greedy=scores, greedy_tokens=[n for _, n, _ in greedy], greedy_truncated=[cut for _, _, cut in greedy],
                          solved=solved, samples=k)


class LiveEvals:
    """The evaluations the loop runs: `jobs` queued by callers, `running` by request id while they generate."""

    def __init__(self) -> None:
        self.jobs: queue.Queue[EvalJob] = queue.Queue()
        self.running: dict[str, EvalJob] = {}
        self.started = 0

    def new(self, prompts: list[Prompt], samples: int) -> EvalJob:
        job = EvalJob(prompts, samples, self.started)
        self.started += 1
        self.jobs.put(job)
        return job

    def submit_queued(self, engine, encode: Callable[[Prompt], list[int]], params, max_tokens: int, version: int) -> None:
        """Submit the queued evaluations' requests (their priority the newest version's, so with rollout.oldest_first
        they queue behind nothing older than the groups just admitted)."""
        while not self.jobs.empty():
            job = self.jobs.get()
            try:
                ids = [encode(p) for p in job.prompts]
            except ValueError as exc:  # a bad prompt names itself
                job.error = str(exc)
                job.done.set()
                continue
            greedy = engine.sampling_params(0.0, 1.0, max_tokens)
            for rid, problem, is_greedy in job.requests():
                self.running[rid] = job
                engine.add(rid, ids[problem], greedy if is_greedy else params, priority=version)
            if not job.prompts:
                job.done.set()

    def take(self, finished: list[Finished], decode: Callable[[list[int]], str]) -> list[Finished]:
        """Hand the validation requests' outputs to their evaluation (decoded here); returns the rest."""
        rest = []
        for out in finished:
            job = self.running.pop(out.request_id, None)
            if job is None:
                rest.append(out)
                continue
            job.responses[out.request_id] = (decode(out.token_ids), len(out.token_ids), out.finish_reason == "length")
            if len(job.responses) == len(job.prompts) * (1 + job.samples):
                job.done.set()
        return rest

    def end(self, engine, why: str) -> None:
        """Abort the validations still generating (the loop stopped); their callers get `why`."""
        jobs = {id(job): job for job in self.running.values()}
        engine.abort(list(self.running))
        self.running.clear()
        for job in jobs.values():
            job.error = why
            job.done.set()
