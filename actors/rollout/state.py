"""What the rollout loop keeps per group and per sample in flight, and the requests other threads hand it."""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from asyncrl.actors.engine import Finished
from asyncrl.core.episode import EpisodeDriver
from asyncrl.core.messages import GroupId
from asyncrl.core.prompts import Prompt


@dataclass
class SampleState:
    """One sample: its episode, whoever plays it (asyncrl.core.episode.EpisodeDriver), and what the loop tracks of
    the request it has in the engine."""

    sample_id: str
    driver: EpisodeDriver
    start: int = 0  # the version its current request started at: its start version while it has sampled nothing
    kept: Finished | None = None  # what aborted requests of its current turn sampled (resume; at stop)
    versions: list[int] = field(default_factory=list)  # per token of its current turn, the version that sampled it, as far as updates noted
    attempt: int = 0  # restarts of its episode (weight_update=abort): a tool outcome of an earlier attempt is dropped
    ended: tuple[int, float] | None = None  # (the version then, wall time) once it ended

    @property
    def done(self) -> bool:
        return self.ended is not None

    def sampled_versions(self) -> list[int]:
        """The version of every token it sampled so far, oldest first: its earlier turns', then its current turn's."""
        return self.driver.episode.sampled_versions() + self.versions

    def oldest(self, version: int) -> int:
        """The version of its oldest sampled token (`version` when it has none): its priority with oldest_first."""
        sampled = self.sampled_versions()
        return sampled[0] if sampled else version


@dataclass
class Group:
    """A prompt's samples (rollout.group_size of them in training; one per problem in an offline evaluation)."""

    gid: GroupId
    prompt: Prompt
    prompt_ids: list[int]
    t_submitted: float = field(default_factory=time.time)
    samples: dict[str, SampleState] = field(default_factory=dict)

    @property
    def group_id(self) -> str:
        return str(self.gid)

    @property
    def finished(self) -> bool:
        return all(s.done for s in self.samples.values())


@dataclass
class Update:
    """A weight update (or a (re)join of the weight group) for the loop to apply between two engine steps."""

    version: int
    payload: object = None  # what the learner's end of the weight transport sent with the version (broadcast: None)
    init_args: tuple | None = None  # (re)join the weight group instead of loading weights (after a worker restart)
    done: threading.Event = field(default_factory=threading.Event)
    result: object = None  # a LoadReport, or for a join whether every engine worker joined
    error: str | None = None
