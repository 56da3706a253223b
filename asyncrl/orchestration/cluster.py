"""The cluster: which Ray cluster to join, the actor pools' placement groups, and the model on every pool node.

Nothing here knows the step loop; the controller asks for pools and gets, for each of their bundles, the node it
landed on and that node's directory of the model.
"""
from __future__ import annotations

import math
import os
import socket
import sys
import uuid
from pathlib import Path

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy

from asyncrl.actors.model_files import ModelFiles
from asyncrl.core.config import Config
from asyncrl.core.models.cache import ModelSource, model_on_this_node
from asyncrl.core.reward_files import reward_runtime_env

ACTOR_ENV = {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "VLLM_NO_USAGE_STATS": "1", "WANDB_SILENT": "true", "VLLM_LOGGING_LEVEL": "ERROR"}


def unreachable(address: str, timeout_s: float = 5.0) -> str:
    """Why nothing answers at a Ray address ("" when something does, or for forms Ray resolves itself)."""
    host, _, port = address.split("://", 1)[-1].rpartition(":")
    if not port.isdigit():  # "auto" and other forms Ray resolves itself
        return ""
    try:
        socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout_s).close()
    except OSError as exc:
        return f"nothing answers at {host}:{port} ({exc})"
    return ""


def check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """Fail in seconds, naming the address, when nothing listens there (ray.init would retry for minutes)."""
    if why := unreachable(address, timeout_s):
        raise ValueError(f"Ray address {address!r} (run.ray_address or RAY_ADDRESS): {why}")


def recorded_cluster() -> tuple[str, str]:
    """(address, file) of the cluster the last `ray start` on this machine recorded, ("", file) if none."""
    from ray._common.utils import get_ray_address_file  # where ray.init() itself looks

    path = get_ray_address_file(None)
    return (Path(path).read_text().strip() if os.path.isfile(path) else ""), path


def choose_cluster(given: str, recorded: str, record_file: str, why_unreachable: str) -> tuple[str, str]:
    """Which cluster to use: (address for ray.init, "" to start a local one; a line to tell the user, or "").

    `given` is run.ray_address or RAY_ADDRESS ("local": always a fresh local cluster); without it, a cluster that
    `ray start` recorded is joined if it answers, and a record left by a head that died without `ray stop` is
    named and passed over (ray.init would try to join it and fail with an unrelated message)."""
    if given:
        return ("" if given == "local" else given), ""
    if not recorded:
        return "", ""
    if why_unreachable:
        return "", (f"asyncrl: {record_file} names a Ray cluster at {recorded}, but {why_unreachable}: a head stopped "
                    f"without `ray stop` left it behind (`ray stop` removes it). Starting a local cluster instead.")
    return recorded, f"asyncrl: joining the Ray cluster at {recorded} (started by `ray start`; run.ray_address=local for a private one)"


def requested_address(cfg: Config) -> str:
    """The Ray address the user asked for: run.ray_address, else RAY_ADDRESS ("" for none)."""
    return cfg.run.ray_address or os.environ.get("RAY_ADDRESS", "")


def connect_ray(cfg: Config) -> bool:
    """Join RAY_ADDRESS / run.ray_address, or the cluster `ray start` recorded, else start a local cluster.
    True if started here."""
    given = requested_address(cfg)
    recorded, record_file = ("", "") if given else recorded_cluster()
    address, message = choose_cluster(given, recorded, record_file, unreachable(recorded) if recorded else "")
    if message:
        print(message, file=sys.stderr, flush=True)
    runtime_env = {"env_vars": ACTOR_ENV, **reward_runtime_env(cfg.task.reward)}  # a file.py:fn reward ships with the job
    if address:
        ray.init(address=address, runtime_env=runtime_env, logging_level="WARNING")
        return False
    need = max(cfg.rollout.num_workers, cfg.rollout.max_workers) * cfg.rollout.num_cpus + cfg.learner.num_workers * cfg.learner.num_cpus + cfg.reward.num_workers * cfg.reward.num_cpus
    ray.init(address="local", num_cpus=max(os.cpu_count() or 1, math.ceil(need)), runtime_env=runtime_env,
             logging_level="WARNING", include_dashboard=False)
    return True


def resource_pool(name: str, n: int, num_cpus: float, num_gpus: float, resources: dict[str, float], timeout_s: float = 120.0) -> PlacementGroup:
    """A placement group of n identical bundles; a clear error when the cluster cannot hold it."""
    bundle = {k: v for k, v in {"CPU": num_cpus, "GPU": num_gpus, **resources}.items() if v > 0}
    bundle = bundle or {"CPU": 0.01}  # asking for nothing (num_cpus=0): Ray refuses an empty bundle; a sliver places it
    pg = placement_group([dict(bundle) for _ in range(n)], strategy="PACK", name=f"asyncrl-{name}-{uuid.uuid4().hex[:6]}")
    ready, _ = ray.wait([pg.ready()], timeout=timeout_s)
    if not ready:
        remove_placement_group(pg)
        raise RuntimeError(
            f"the {name} pool ({n} x {bundle}) could not be placed within {timeout_s:.0f} s; "
            f"cluster resources: {ray.cluster_resources()}"
        )
    return pg


def in_pool(pg: PlacementGroup, index: int) -> PlacementGroupSchedulingStrategy:
    return PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=index)


def bundle_nodes(pg: PlacementGroup) -> list[str]:
    """The node id of each bundle of a placed group, in bundle order."""
    table = ray.util.placement_group_table(pg)["bundles_to_node_id"]
    return [table[i] for i in range(len(table))]


def place_model(model: ModelSource, nodes: set[str]) -> dict[str, str]:
    """Each node's directory of the model: on the driver's node its own; on every other node found there, or for a
    built-in copied from the driver's node first (one task per node). A node that lacks a local model directory
    fails the run with a ValueError naming the node and the path."""
    here = ray.get_runtime_context().get_node_id()
    paths = {here: model.path}
    others = sorted(nodes - {here})
    if not others:
        return paths
    pin = NodeAffinitySchedulingStrategy(here, soft=False)
    files = ray.remote(ModelFiles).options(num_cpus=0, scheduling_strategy=pin).remote(model.path) if model.builtin else None
    read = None if files is None else (lambda rel, offset, size: ray.get(files.read.remote(rel, offset, size)))
    find = ray.remote(model_on_this_node)
    refs = [find.options(num_cpus=0, max_retries=0, scheduling_strategy=NodeAffinitySchedulingStrategy(n, soft=False)).remote(model, read)
            for n in others]
    try:
        paths.update(zip(others, ray.get(refs)))
    except ray.exceptions.RayTaskError as exc:
        raise ValueError(str(exc.cause)) from None
    finally:
        if files is not None:
            ray.kill(files)
    return paths
