"""The GPU ends of `learner.weight_transport`, the same classes the learner and the engine workers build, on real
CUDA tensors in two processes: `cuda_ipc` (CudaIpcSender -> handles by pickle -> CudaIpcReceiver) and `broadcast`
over NCCL (two ranks need two GPUs: NCCL refuses two ranks on one device). Skipped without CUDA; run on a GPU
machine with `python -m pytest tests/test_weight_transport_gpu.py` (docs/gpu-status.md)."""
import pytest
import torch
import torch.multiprocessing as mp

from asyncrl.core.weights import free_port, make_receiver, make_sender, pack, plan_buckets, tensor_meta
from tests.test_weight_transport import leave, two_ranks

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

VERSIONS = 2


def _tensors(device: str) -> list[torch.Tensor]:
    torch.manual_seed(0)
    shapes = [(300, 100), (7,), (50, 40), (1000,)]
    return [torch.randn(s).to(device=device, dtype=torch.bfloat16) for s in shapes]


def _buckets(tensors):
    meta = tensor_meta((f"t{i}", t) for i, t in enumerate(tensors))
    return meta, plan_buckets(meta, 70_000)  # several buckets, one tensor larger than a bucket


def _ipc_learner(handles_q, done_q, results) -> None:
    params = _tensors("cuda:0")
    meta, buckets = _buckets(params)
    sender = make_sender("cuda_ipc", "nccl")
    sender.connect("127.0.0.1", 0, 2, "asyncrl-weights-test")
    for version in range(VERSIONS):
        nbytes, handles = sender.send(pack(params, b) for b in buckets)  # the learner's gathered buckets
        sender.wait()
        for p in params:
            p.mul_(2.0)  # the next optimizer step, before the engine has loaded: it must see the snapshot
        handles_q.put((version, handles))
        assert done_q.get(timeout=120) == version  # the engine loaded it: the snapshot may go
        sender.release()
        results[f"sent_bytes{version}"] = nbytes
    handles_q.put(None)


def _ipc_engine(handles_q, done_q, results) -> None:
    torch.cuda.set_device(0)
    meta, buckets = _buckets(_tensors("cpu"))
    receiver = make_receiver("cuda_ipc", "nccl", meta, buckets, torch.device("cuda:0"))
    receiver.connect("127.0.0.1", 0, 1, 2, "asyncrl-weights-test")
    while (item := handles_q.get(timeout=120)) is not None:
        version, handles = item
        got = receiver.receive(handles)
        results[version] = [(name, t.device.type, t.float().cpu().clone()) for name, t in got]
        done_q.put(version)
    results["nbytes"] = receiver.nbytes


def test_cuda_ipc_hands_the_engine_the_snapshot_of_each_version():
    ctx = mp.get_context("spawn")
    with ctx.Manager() as manager:
        results, handles_q, done_q = manager.dict(), ctx.Queue(), ctx.Queue()
        procs = [ctx.Process(target=f, args=(handles_q, done_q, results)) for f in (_ipc_learner, _ipc_engine)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(180)
        assert [p.exitcode for p in procs] == [0, 0]
        results = dict(results)
    original = _tensors("cpu")
    assert results["sent_bytes0"] == results["nbytes"] == sum(t.numel() * 2 for t in original)
    for version in range(VERSIONS):
        assert [n for n, _, _ in results[version]] == [f"t{i}" for i in range(len(original))]
        for (_, device, got), want in zip(results[version], original):
            assert device == "cuda"
            assert torch.equal(got, want.float() * 2.0**version)  # the version as sent, not the later step


def _nccl_end(rank: int, port: int, results) -> None:
    torch.cuda.set_device(rank)
    tensors = _tensors(f"cuda:{rank}")
    meta, buckets = _buckets(tensors)
    if rank == 0:
        sender = make_sender("broadcast", "nccl")
        sender.connect("127.0.0.1", port, 2, "asyncrl-weights-test")
        results["sent"] = sender.send(pack(tensors, b) for b in buckets)[0]
        sender.wait()
        torch.cuda.synchronize()
        return leave(sender.sender.group)
    receiver = make_receiver("broadcast", "nccl", meta, buckets, torch.device(f"cuda:{rank}"))
    receiver.connect("127.0.0.1", port, 1, 2, "asyncrl-weights-test")
    results["got"] = [(n, t.float().cpu().clone()) for n, t in receiver.receive(None)]
    leave(receiver.receiver.group)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL needs one GPU per rank")
def test_nccl_broadcast_delivers_every_bucket():
    results = two_ranks(_nccl_end)
    assert results["sent"] == sum(t.numel() * 2 for t in _tensors("cpu"))
    assert all(torch.equal(got, want.float()) for (_, got), want in zip(results["got"], _tensors("cpu")))


def test_the_nccl_group_forms_and_a_bucket_broadcast_completes_on_one_gpu():
    """One rank: what a single GPU can check of the NCCL path (init_group's process-group construction with the NCCL
    backend, and the flat uint8 view that `_broadcast` posts), with the learner's own sender classes."""
    tensors = _tensors("cuda:0")
    meta, buckets = _buckets(tensors)
    sender = make_sender("broadcast", "nccl")
    sender.connect("127.0.0.1", free_port(), 1, "asyncrl-weights-test")
    assert sender.send(pack(tensors, b) for b in buckets)[0] == sum(m.nbytes for m in meta)
    sender.wait()
    torch.cuda.synchronize()
    assert all(torch.equal(t, w) for t, w in zip(tensors, _tensors("cuda:0")))
