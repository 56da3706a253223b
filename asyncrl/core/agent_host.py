"""A rollout worker's agents (env.agent): each episode's agent program in a killable process, and the endpoint
they call (asyncrl.core.agent_endpoint), seen by the worker's loop as a tool pool is."""
from __future__ import annotations

import json
import time

from asyncrl.core.agents import AgentEnd
from asyncrl.core.chat_api import ChatRequest
from asyncrl.core.tools import ToolOutcome, ToolPool


class AgentHost:
    """A rollout worker's agents, seen by its loop as a ToolPool is (`submit`, `poll`, `pending`, `pids`, `close`):
    `start` runs an episode's agent in a tool process; `submit` after a model turn says the episode waits for its
    agent; `poll` hands each waiting episode its agent's next event (a ChatRequest, an AgentEnd, or an error)."""

    def __init__(self, agent: str, size: int, timeout_s: float, port: int) -> None:
        self.agent = agent
        self.pool = ToolPool("agent", size, timeout_s, agent=agent, timeout_key="env.agent_timeout_s")
        self.keys: dict[str, object] = {}  # episode id -> the loop's key for it, while its agent runs
        self.episodes: dict[object, str] = {}  # the other way round
        self.awaiting: dict[object, float] = {}  # key -> since when it waits for its agent
        self.held: dict[object, list[ToolOutcome]] = {}  # events for an episode that is not waiting (yet)
        from asyncrl.core.agent_endpoint import Endpoint  # here: FastAPI and uvicorn load only where agents run

        self.endpoint = Endpoint(port, lambda episode_id: episode_id in self.keys, timeout_s)
        self.base_url = self.endpoint.base_url

    def start(self, key: object, episode_id: str, prompt) -> None:
        self.keys[episode_id], self.episodes[key] = key, episode_id
        self.awaiting[key] = time.monotonic()
        task = {"prompt": prompt.text, "answer": prompt.answer, "prompt_id": prompt.prompt_id, "episode_id": episode_id,
                "base_url": self.endpoint.episode_url(episode_id)}
        self.pool.submit(key, "agent", json.dumps(task))

    def submit(self, key: object, name: str, argument: str) -> None:
        self.awaiting[key] = time.monotonic()

    def pending(self) -> int:
        """Agents running or queued (an update with drain waits for them)."""
        return self.pool.pending()

    def poll(self) -> list[ToolOutcome]:
        for outcome in self.pool.poll():  # agents that returned, raised, died or timed out
            episode_id = self.episodes.pop(outcome.key, None)
            if episode_id is not None:  # not forgotten
                del self.keys[episode_id]
                self.held.setdefault(outcome.key, []).append(self._ended(outcome))
        for request in self.endpoint.take():
            key = self.keys.get(request.episode_id)
            if key is None:
                request.fail(404, f"episode {request.episode_id!r} has ended")
                continue
            self.held.setdefault(key, []).append(ToolOutcome(key, request, None, 0.0))
        ready = []
        for key in [k for k in self.held if k in self.awaiting]:
            event = self.held[key].pop(0)
            if not self.held[key]:
                del self.held[key]
            ready.append(ToolOutcome(key, event.result, event.error, time.monotonic() - self.awaiting.pop(key)))
        return ready

    def _ended(self, outcome: ToolOutcome) -> ToolOutcome:
        if outcome.error is not None:
            return ToolOutcome(outcome.key, None, f"agent {self.agent}: {outcome.error}", outcome.seconds)
        try:
            return ToolOutcome(outcome.key, AgentEnd(float(outcome.result)), None, outcome.seconds)
        except ValueError:
            return ToolOutcome(outcome.key, None, f"agent {self.agent} did not return a reward: {outcome.result}", outcome.seconds)

    def forget(self, key: object, why: str) -> None:
        """An episode that ended before its agent returned: its agent's later requests are answered 404 with `why`."""
        self.awaiting.pop(key, None)
        episode_id = self.episodes.pop(key, None)
        self.keys.pop(episode_id, None)
        for event in self.held.pop(key, []):
            if isinstance(event.result, ChatRequest):
                event.result.fail(404, f"episode {episode_id!r} has ended: {why}")

    def pids(self) -> list[int]:
        return self.pool.pids()

    def reset(self) -> None:
        """The run stopped: every agent still running is killed and its requests are answered 503."""
        for request in self.endpoint.take() + [e.result for events in self.held.values() for e in events if isinstance(e.result, ChatRequest)]:
            request.fail(503, "the run stopped")
        self.keys, self.episodes, self.awaiting, self.held = {}, {}, {}, {}
        self.pool.close()
        self.pool = ToolPool("agent", self.pool.size, self.pool.timeout_s, agent=self.agent, timeout_key="env.agent_timeout_s")

    def close(self) -> None:
        self.reset()
        self.pool.close()
        self.endpoint.close()
