"""WeightSender / WeightReceiver over a real two-process gloo group: the receiver gets exactly the
weights as they were at `publish` while the receiver comes late. The parameters live in the send
buffers; the sender waits for the transfer before changing them, as the learner does before an
optimizer step."""
import time

import pytest
import torch
import torch.multiprocessing as mp

from asyncrl.core.weights import (
    WeightReceiver, WeightSender, flatten_into_buckets, free_port, init_group, make_receiver, make_sender, pack, plan_buckets, tensor_meta,
)

VERSIONS = 3


def _tensors() -> list[torch.Tensor]:
    torch.manual_seed(0)
    return [torch.randn(300, 100), torch.randn(7), torch.randn(50, 40), torch.randn(1000)]


def leave(group) -> None:
    """Destroy a weight group before its process exits: with the group alive at exit, gloo's threads abort the
    process ("terminate called without an active exception", SIGABRT; 3 runs in 10 of the publish test)."""
    torch.distributed.destroy_process_group(group)


def _end(rank: int, port: int, results) -> None:
    tensors = _tensors()
    meta = tensor_meta((f"t{i}", t) for i, t in enumerate(tensors))
    buckets = plan_buckets(meta, 130_000)  # several buckets, one tensor larger than a bucket
    group = init_group("127.0.0.1", port, rank, 2, "gloo", "asyncrl-weights-test", timeout_s=60)
    if rank == 0:
        sender = WeightSender(group, flatten_into_buckets(tensors, buckets))
        assert torch.equal(tensors[0], _tensors()[0])  # flattening keeps the values
        for _ in range(VERSIONS):
            results["sent_bytes"] = sender.publish()
            sender.wait()  # the contract: the transfer leaves the parameters before they change
            for t in tensors:
                t.mul_(2.0)  # the next optimizer step, while the version travels
        sender.wait()
        return leave(group)
    receiver = WeightReceiver(group, meta, buckets, torch.device("cpu"))
    for version in range(VERSIONS):
        time.sleep(0.3)  # the engine takes the update late
        got = receiver.receive()
        results[version] = [(name, t.clone()) for name, t in got]
    leave(group)


def two_ranks(end) -> dict:
    """Run `end(rank, port, results)` as ranks 0 and 1 in two processes; what they put in `results`."""
    port = free_port()
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(end, args=(port, results), nprocs=2, join=True)
        return dict(results)


def test_receiver_gets_the_weights_as_they_were_at_publish():
    results = two_ranks(_end)
    original = _tensors()
    assert results["sent_bytes"] == sum(t.numel() * 4 for t in original)
    for version in range(VERSIONS):
        names = [name for name, _ in results[version]]
        assert names == [f"t{i}" for i in range(len(original))]
        for (_, got), want in zip(results[version], original):
            assert torch.equal(got, want * 2.0**version)  # the weights at publish time, not after the later steps


def _factory_end(rank: int, port: int, results) -> None:
    """Both ends built by name, as the learner and the engine worker build theirs."""
    tensors = _tensors()
    meta = tensor_meta((f"t{i}", t) for i, t in enumerate(tensors))
    buckets = plan_buckets(meta, 130_000)
    if rank == 0:
        sender = make_sender("broadcast", "gloo")
        sender.connect("127.0.0.1", port, 2, "asyncrl-weights-test")
        results["sent"] = sender.send(pack(tensors, b) for b in buckets)  # streamed: at most two buckets in flight
        sender.wait()
        sender.release()
        return leave(sender.sender.group)
    receiver = make_receiver("broadcast", "gloo", meta, buckets, torch.device("cpu"))
    receiver.connect("127.0.0.1", port, 1, 2, "asyncrl-weights-test")
    time.sleep(0.3)  # the engine posts its receives late: the sender's third bucket waits for the first
    results["got"] = [(n, t.clone()) for n, t in receiver.receive(None)]
    results["nbytes"] = receiver.nbytes
    leave(receiver.receiver.group)


def test_the_transport_is_chosen_by_name_in_one_place():
    results = two_ranks(_factory_end)
    sent_bytes, payload = results["sent"]
    assert payload is None and sent_bytes == results["nbytes"] == sum(t.numel() * 4 for t in _tensors())
    assert all(torch.equal(got, want) for (_, got), want in zip(results["got"], _tensors()))
    meta = tensor_meta((f"t{i}", t) for i, t in enumerate(_tensors()))
    ipc = make_receiver("cuda_ipc", "nccl", meta, plan_buckets(meta, 130_000), torch.device("cpu"))
    assert type(ipc).__name__ == "CudaIpcReceiver" and ipc.nbytes == sent_bytes
    assert type(make_sender("cuda_ipc", "nccl")).__name__ == "CudaIpcSender"
    with pytest.raises(ValueError, match="weight transport 'shm'"):
        make_sender("shm", "gloo")


def _abandoned_end(rank: int, port: int, results) -> None:
    """The sender posts nothing (it is held up by another receiver, as when an engine froze before taking the
    broadcast); the receiver's receive is abandoned after 1 s from another thread, as the worker's actor call does."""
    import threading

    from asyncrl.core.weights import abandon_receives

    tensors = _tensors()
    meta = tensor_meta((f"t{i}", t) for i, t in enumerate(tensors))
    group = init_group("127.0.0.1", port, rank, 2, "gloo", "asyncrl-weights-test", timeout_s=60)
    if rank == 1:
        receiver = WeightReceiver(group, meta, plan_buckets(meta, 130_000), torch.device("cpu"))
        timer = threading.Timer(1.0, lambda: results.update(told=abandon_receives()))
        timer.start()
        t0 = time.monotonic()
        try:
            receiver.receive()
        except RuntimeError as exc:
            results["error"], results["after_s"] = str(exc), time.monotonic() - t0
        timer.join()  # the receive may fail before the timer's thread records how many it told
    results[f"done{rank}"] = True
    while len([k for k in results.keys() if k.startswith("done")]) < 2:
        time.sleep(0.05)
    # the group is not left (its receives are still posted): the process ends without the gloo threads' abort
    import os
    os._exit(0)


def test_a_receive_abandoned_by_the_sender_fails_at_once_not_at_the_group_timeout():
    """gloo tells a receiver nothing when the sender gives up on another receiver: without `abandon_receives` the
    receive waits for the group's timeout (60 s here, 300 s in a run)."""
    results = two_ranks(_abandoned_end)
    assert results["told"] == 1
    assert results["error"].startswith("the weight broadcast was abandoned")
    assert 0.9 <= results["after_s"] < 5.0
