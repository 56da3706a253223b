"""Weight-sync cost: asyncrl's bucketed broadcast against a raw torch.distributed broadcast of the same bytes.

    .venv/bin/python bench/weight_sync.py                    # tiny model and a ~0.5B Qwen2-shaped model, gloo
    .venv/bin/python bench/weight_sync.py --sizes tiny --repeats 20

Two processes on this machine form a gloo group through the same function the
learner uses (`asyncrl.core.weights.init_group`, the protocol SGLang joins with). Rank 0
publishes a model's parameters with `WeightSender` as the learner does (bucket
plan of `learner.sync_bucket_mb`, parameters living in their buckets' buffers,
every bucket posted in place) and rank 1 receives them with `WeightReceiver`
(persistent buffers, every receive posted at once), from a common start to the
last byte; then rank 0 broadcasts one flat tensor of the
same byte count (the raw transport). Reported: seconds and bytes per sync, the
bandwidths and their ratio, and how long `publish` blocks the learner (it
returns once every bucket is posted; the transfer overlaps the next step). The engine's `reload_weights` is not included here (see
bench/overlap.py for a sync's full breakdown inside a run).
Writes bench/results/weight_sync.{md,json}.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from results_io import provenance, publish  # bench/ is on sys.path when a benchmark runs as a script

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
if TYPE_CHECKING:
    import torch  # imported where used: `render` (bench/tables.py) must not need it

# Qwen2-0.5B's shape (random weights: only the bytes matter); built on the meta device and materialised with
# to_empty, which unties lm_head from the embedding, so 630 M parameters travel instead of 494 M
SIZES = {
    "tiny": None,
    "0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2, vocab_size=151936),
}


def build_params(size: str) -> list[tuple[str, torch.Tensor]]:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from asyncrl.core.models.tiny import TinySpec, build_model, build_tokenizer

    torch.manual_seed(0)
    if SIZES[size] is None:
        model = build_model(TinySpec(), len(build_tokenizer()))
    else:
        with torch.device("meta"):
            model = Qwen2ForCausalLM(Qwen2Config(tie_word_embeddings=True, **SIZES[size]))
        model = model.to_empty(device="cpu")
    return [(n, p.detach()) for n, p in model.named_parameters()]


def worker(rank: int, port: int, size: str, bucket_mb: float, repeats: int, out: dict) -> None:
    import torch

    from asyncrl.core.weights import WeightReceiver, WeightSender, _broadcast, flatten_into_buckets, init_group, plan_buckets, tensor_meta

    torch.set_num_threads(1)
    named = build_params(size)
    meta = tensor_meta(iter(named))
    buckets = plan_buckets(meta, int(bucket_mb * 2**20))
    group = init_group("127.0.0.1", port, rank, 2, "gloo", "asyncrl-weights-bench")
    tensors = [t for _, t in named]
    nbytes = sum(m.nbytes for m in meta)
    if rank == 0:  # as the learner: parameters in their send buckets, sent in place
        end = WeightSender(group, flatten_into_buckets(tensors, buckets))
    else:
        end = WeightReceiver(group, meta, buckets, torch.device("cpu"))
    flat = torch.zeros(nbytes // 4, dtype=torch.float32)
    barrier = torch.zeros(1)
    timings: dict[str, list[float]] = {"asyncrl": [], "raw": [], "blocked": []}
    for _ in range(repeats):
        _broadcast(group, barrier).wait()  # both ends start together
        t0 = time.perf_counter()
        if rank == 0:
            end.publish()
            timings["blocked"].append(time.perf_counter() - t0)  # what the learner waits for before its next step
            end.wait()
        else:
            end.receive()
        timings["asyncrl"].append(time.perf_counter() - t0)
        _broadcast(group, barrier).wait()
        t0 = time.perf_counter()
        _broadcast(group, flat).wait()
        timings["raw"].append(time.perf_counter() - t0)
    if rank == 0:
        out["blocked_s"] = statistics.median(timings["blocked"])
    else:
        out.update({"size": size, "params": sum(m.numel for m in meta), "bytes": nbytes, "buckets": len(buckets),
                    "asyncrl_s": statistics.median(timings["asyncrl"]), "raw_s": statistics.median(timings["raw"])})


def measure(size: str, bucket_mb: float, repeats: int) -> dict:
    import torch.multiprocessing as mp

    from asyncrl.core.weights import free_port

    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(worker, args=(free_port(), size, bucket_mb, repeats, out), nprocs=2, join=True)
        return dict(out)


def render(result: dict) -> str:
    """The table, from the published result alone."""
    repeats = result["repeats"]
    lines = [f"Weight sync over gloo between two processes on this machine, bucket {result['bucket_mb']:g} MB, median of "
             f"{repeats or '50 (tiny) / 5 (0.5b)'} syncs, after a shared barrier",
             f"(`bench/weight_sync.py {' '.join(result['argv'])}`)", "",
             "| model | parameters | bytes | buckets | asyncrl send+receive | raw broadcast | asyncrl GB/s | raw GB/s | ratio | learner blocked |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["results"]:
        lines.append(f"| {r['size']} | {r['params'] / 1e6:.1f} M | {r['bytes'] / 2**20:.1f} MiB | {r['buckets']} | {r['asyncrl_s'] * 1e3:.1f} ms "
                     f"| {r['raw_s'] * 1e3:.1f} ms | {r['bytes'] / r['asyncrl_s'] / 1e9:.2f} | {r['bytes'] / r['raw_s'] / 1e9:.2f} "
                     f"| {r['raw_s'] / r['asyncrl_s']:.2f} | {r['blocked_s'] * 1e3:.1f} ms |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["tiny", "0.5b"], choices=sorted(SIZES))
    parser.add_argument("--bucket-mb", type=float, default=64.0, help="learner.sync_bucket_mb")
    parser.add_argument("--repeats", type=int, help="syncs per size (default: 50 for tiny, where a sync takes ms, 5 for 0.5b)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args()
    start = provenance(sys.argv[1:])
    results = [measure(size, args.bucket_mb, args.repeats or (50 if size == "tiny" else 5)) for size in args.sizes]
    data = {"results": results, "bucket_mb": args.bucket_mb, "repeats": args.repeats, "argv": sys.argv[1:]}
    publish(args.out, "weight_sync", "weight_sync", data, sys.argv[1:], start)


if __name__ == "__main__":
    main()
