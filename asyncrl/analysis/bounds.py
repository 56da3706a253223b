"""What overlapping generation with training can gain, as pure functions (bench/overlap.py reports them).

Everything is per trained sample, so runs with different batch sizes compare (the synchronous baseline generates
a whole rollout batch, then makes several optimizer updates on it; the asynchronous run trains smaller batches).

- An asynchronous run keeps two pools busy at once: its rollout pool needs `gen_s` of generation work per sample
  and its learner `train_s + sync_s` (the sync on the learner's path). A perfect pipeline of the two takes
  max(gen_s, train_s + sync_s) per sample: the run's own **pipeline bound**. Its **efficiency** is that bound
  over the time it took; it cannot exceed 1 (neither pool can do more than its work in less time).
- Against a synchronous baseline that took `sync_run_s` per sample, the **ideal speedup** is sync_run_s over the
  async run's pipeline bound, and the achieved speedup is exactly ideal x efficiency.

Where the synchronous baseline colocates (each phase on the whole machine in turn) and the asynchronous run splits
the machine between its pools, each phase runs on a fraction of the machine in the asynchronous run: the ideal
speedup then says how much the split loses to a phase that scales well (on two cores: a phase that runs twice as
fast on both) and gains from one that does not, and from the generation tail that a synchronous batch waits for
(`split_bound`).
"""
from __future__ import annotations

from dataclasses import dataclass

MAX_EFFICIENCY = 1.05
"""An efficiency above this is a measurement or accounting error (the bound is 1; 5 % of noise is allowed)."""


@dataclass(frozen=True)
class Phases:
    """Seconds of work per trained sample."""

    gen_s: float  # the rollout pool's engine stepping (its busy time over the samples it generated)
    train_s: float  # the learner's compute
    sync_s: float  # weight sync on the learner's path

    def __post_init__(self) -> None:
        if min(self.gen_s, self.train_s, self.sync_s) < 0:
            raise ValueError(f"phase times cannot be negative: {self}")

    @property
    def serial_s(self) -> float:
        """One after the other: a synchronous step's time per sample."""
        return self.gen_s + self.train_s + self.sync_s

    @property
    def pipelined_s(self) -> float:
        """Both pools busy at once, each with its own work: the fastest an asynchronous run can go."""
        return max(self.gen_s, self.train_s + self.sync_s)


def efficiency(async_run_s: float, phases: Phases) -> float:
    """The async run's pipeline bound over the time per sample it took (1: no bubble in either pool)."""
    return phases.pipelined_s / async_run_s


def ideal_speedup(sync_run_s: float, phases: Phases) -> float:
    """How much faster than a synchronous run of `sync_run_s` per sample a perfect pipeline of `phases` would be."""
    return sync_run_s / phases.pipelined_s


def split_bound(gen_1: float, train_1: float, gen_scaling: float, train_scaling: float) -> float:
    """Ideal speedup of two pools of one unit each over one pool of two units taking turns.

    `gen_1`, `train_1`: each phase's time per sample on one unit (a core, a GPU); `*_scaling`: how much faster the
    phase runs on two units (2: perfectly). The synchronous run takes gen_1/gen_scaling + train_1/train_scaling;
    the asynchronous one max(gen_1, train_1). With both phases scaling perfectly this is at most 1: overlap pays
    only for what does not scale (and the generation tail a synchronous batch waits on, counted in a measured
    gen time)."""
    if min(gen_1, train_1) <= 0 or min(gen_scaling, train_scaling) <= 0:
        raise ValueError("times and scalings must be positive")
    return (gen_1 / gen_scaling + train_1 / train_scaling) / max(gen_1, train_1)


def check_efficiency(value: float, what: str) -> None:
    """A ValueError naming `what` when an efficiency is above MAX_EFFICIENCY: the figure is impossible."""
    if value > MAX_EFFICIENCY:
        raise ValueError(f"{what}: efficiency {value:.3f} > {MAX_EFFICIENCY}, above its bound of 1: the measurement or "
                         "its accounting is wrong, and the figure is not reported")


SCHEDULING_KEYS = frozenset({
    "rollout.max_inflight_groups", "rollout.cpu_affinity", "rollout.torch_threads", "rollout.weight_update",
    "rollout.oldest_first", "buffer.max_staleness", "buffer.capacity_groups", "buffer.oldest_first",
    "learner.batch_size", "learner.mini_batches", "learner.micro_batch_size", "learner.cpu_affinity",
    "learner.torch_threads", "learner.sync_every", "run.output_dir", "run.steps", "run.max_train_minutes",
    "run.checkpoint_every", "run.eval", "logging.wandb", "logging.console",
})
"""Keys two runs may differ in and still be compared for speed: how the work is scheduled, not what it is."""


def unlike(a: dict, b: dict, allowed: frozenset[str] = SCHEDULING_KEYS) -> list[str]:
    """The dotted keys (outside `allowed`) in which two runs' configs (`Config.to_dict()`) differ: a speed ratio of
    two runs is only reported when this is empty. The update size (batch_size / mini_batches) must match too."""
    flat_a, flat_b = _flat(a), _flat(b)
    differ = sorted(k for k in flat_a.keys() | flat_b.keys() if k not in allowed and flat_a.get(k) != flat_b.get(k))
    size_a = a["learner"]["batch_size"] // a["learner"]["mini_batches"]
    size_b = b["learner"]["batch_size"] // b["learner"]["mini_batches"]
    return differ + ([f"update size (learner.batch_size / mini_batches): {size_a} vs {size_b}"] if size_a != size_b else [])


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in d.items():
        if isinstance(value, dict) and not (prefix + key).endswith("resources"):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[prefix + key] = value
    return out
