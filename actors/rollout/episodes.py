"""Each sample's episode driver (asyncrl.core.episode): one model turn, an environment's episode, or an agent's."""
from __future__ import annotations

import zlib

from asyncrl.core.agents import AgentRun
from asyncrl.core.chat import AgentCodec, encode_prompt, observation_ids
from asyncrl.core.config import Config
from asyncrl.core.episode import EpisodeDriver, EpisodeLimits, EpisodeRun, SingleTurn
from asyncrl.core.prompts import Prompt
from asyncrl.core.tool_calls import parser_class


class BadPrompt(ValueError):
    """A prompt the engine cannot take; the message says why."""


class EpisodeMaker:
    """Encodes a group's prompt and makes its samples' drivers. `env_cls`: the environment (env.name; with env.agent
    asyncrl.core.agents.AgentEnvironment), None for single-turn tasks; `agent`: whether an agent plays them."""

    def __init__(self, cfg: Config, tokenizer, env_cls, agent: bool) -> None:
        e, r = cfg.env, cfg.rollout
        self.cfg, self.tokenizer, self.env_cls, self.agent = cfg, tokenizer, env_cls, agent
        self.limits = EpisodeLimits(e.max_turns, e.max_episode_tokens, r.max_new_tokens)
        self.eos_ids = frozenset(i for i in (tokenizer.eos_token_id,) if i is not None)
        self.max_prompt = cfg.model.max_model_len - (e.max_episode_tokens if env_cls else r.max_new_tokens)
        self.codec = AgentCodec(tokenizer, e.tool_parser) if agent else None
        if agent:
            parser_class(e.tool_parser)  # an unknown parser fails the worker's start, not an episode

    def opening(self, prompt: Prompt) -> str | list[dict]:
        """What the model sees first: the prompt, or its environment's first message."""
        return self.env_cls(prompt, 0).start() if self.env_cls else prompt.content

    def encode(self, text: str | list[dict]) -> list[int]:
        """The prompt's token ids (`text`: a prompt, or an environment's opening chat messages); BadPrompt when it is
        empty or leaves no room for `rollout.max_new_tokens` (an episode: `env.max_episode_tokens`)."""
        if not (text.strip() if isinstance(text, str) else text):
            raise BadPrompt("empty prompt")
        ids = encode_prompt(self.tokenizer, text, self.cfg.task.chat)
        if not ids:
            raise BadPrompt("prompt encodes to 0 tokens")
        if len(ids) > self.max_prompt:
            raise BadPrompt(
                f"prompt encodes to {len(ids)} tokens; the limit is {self.max_prompt} (model.max_model_len - "
                f"{'env.max_episode_tokens' if self.env_cls else 'rollout.max_new_tokens'})"
            )
        return ids

    def eval_ids(self, prompt: Prompt, text: str | list[dict] | None = None) -> list[int]:
        """An evaluation prompt's ids (`text`: its opening, default its content): a bad one is a ValueError that
        names it, not a drop."""
        try:
            return self.encode(prompt.content if text is None else text)
        except BadPrompt as exc:
            raise ValueError(f"eval prompt {prompt.prompt_id!r}: {exc}") from exc

    def new(self, prompt: Prompt, prompt_ids: list[int], sample_id: str) -> EpisodeDriver:
        """A sample's driver from its first turn; an environment's seed is the run's and the sample id's (a restart
        replays the same environment); an agent's episode id is the sample id."""
        tok, chat = self.tokenizer, self.cfg.task.chat
        if self.agent:
            return AgentRun(sample_id, self.limits, self.codec, self.eos_ids, self.max_prompt)
        if self.env_cls is not None:
            env = self.env_cls(prompt, seed=self.cfg.run.seed * 1_000_003 + zlib.crc32(sample_id.encode()))
            return EpisodeRun(env, prompt_ids, self.limits, lambda text, after_eos: observation_ids(tok, text, chat, after_eos),
                              self.decode, self.eos_ids)
        return SingleTurn(prompt_ids, self.limits.turn_tokens)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)
