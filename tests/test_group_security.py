"""Nobody joins the weight group uninvited: the learner hosts the group's store on loopback only (one node), and its
keys live under a per-group secret handed out through Ray, so a stranger who reaches the port and tries the old,
port-derived name cannot join; the group's own ranks go on and the weights arrive exactly."""
import os

import psutil
import pytest
import torch
import torch.multiprocessing as mp

from asyncrl.core.weights import _broadcast, group_name, init_group, listen_socket, new_secret

HOST = "127.0.0.1"


def _learner(name: str, ports, results) -> None:
    listener = listen_socket(HOST)
    port = listener.getsockname()[1]
    ports.put(port)
    group = init_group(HOST, port, 0, 2, "gloo", name, timeout_s=60, listener=listener)
    results["store_addresses"] = sorted({c.laddr.ip for c in psutil.Process(os.getpid()).net_connections(kind="tcp")
                                         if c.status == psutil.CONN_LISTEN and c.laddr.port == port})
    _broadcast(group, torch.arange(6, dtype=torch.float32)).wait()
    torch.distributed.destroy_process_group(group)


def _engine(name: str, port: int, results) -> None:
    group = init_group(HOST, port, 1, 2, "gloo", name, timeout_s=60)
    got = torch.zeros(6)
    _broadcast(group, got).wait()
    results["received"] = got.tolist()
    torch.distributed.destroy_process_group(group)


def _stranger(port: int, results) -> None:
    """Joins as rank 1 under the name the group had before it got a secret (derived from its port)."""
    try:
        init_group(HOST, port, 1, 2, "gloo", f"asyncrl-weights-{port}", timeout_s=5)
        results["stranger"] = "joined"
    except Exception as exc:  # noqa: BLE001 - whatever torch raises, it did not join
        results["stranger"] = f"refused: {type(exc).__name__}"


@pytest.mark.timeout(120)
def test_a_stranger_with_the_old_naming_scheme_cannot_join_the_weight_group():
    name = group_name(new_secret())
    assert name != group_name(new_secret()) and len(name) > 32  # a fresh 128-bit secret each time
    ctx = mp.get_context("spawn")
    with ctx.Manager() as manager:
        ports, results = manager.Queue(), manager.dict()
        learner = ctx.Process(target=_learner, args=(name, ports, results))
        learner.start()
        port = ports.get(timeout=60)
        stranger = ctx.Process(target=_stranger, args=(port, results))
        stranger.start()
        stranger.join(60)  # it tries first, while the learner waits for its engine
        engine = ctx.Process(target=_engine, args=(name, port, results))
        engine.start()
        for p in (engine, learner):
            p.join(60)
        outcome = dict(results)
    assert outcome["stranger"].startswith("refused"), outcome
    assert outcome["received"] == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]  # the group's own ranks go on, the weights exact
    assert outcome["store_addresses"] == [HOST]  # the store listens on loopback only
