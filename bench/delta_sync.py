"""Would delta syncs pay? The fraction of weights one learner step changes, and what sending only those would cost.

    .venv/bin/python bench/delta_sync.py --config configs/smollm2_word_problems.yaml --lr 1e-6 --steps 4

One asyncrl run of the config with every parameter trained and sent (`learner.lora.rank=0`), at the learning rate
given, a snapshot of the policy after every step (`run.snapshot_every=1`, the learner's float32 master weights).
For each pair of consecutive snapshots: the fraction of elements that changed as float32 (what this CPU's engines
are sent) and as bfloat16 (what a GPU engine serving bf16 is sent: a change below bf16's rounding is no change),
and the bytes of a sparse delta (int32 index + value per changed element) against the full tensors. The time to
encode a delta (compare with the last version sent, find and gather the changed elements) is measured on the
last pair; the time to send a byte is the full sync's, from `time/weight_send_s` of the same run. A delta pays
when encoding it and sending it take less than sending everything: the table says, per dtype, by how much.
Writes bench/results/delta_sync_<config>.{json,md}.
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from pathlib import Path

from results_io import ROOT, provenance, publish, run_asyncrl

INDEX_BYTES = 4  # an int32 index per changed element


# ----------------------------------------------------------------------------- pure logic (tested)
def changed(before: dict, after: dict) -> dict[str, tuple[int, int, int]]:
    """Per dtype ("float32", "bfloat16"): (elements changed, elements, bytes of one element) between two state dicts."""
    import torch

    out = {}
    for dtype, size in (("float32", 4), ("bfloat16", 2)):
        t = getattr(torch, dtype)
        n_changed = n = 0
        for name, a in after.items():
            b = before[name]
            n += a.numel()
            n_changed += int(torch.count_nonzero(a.to(t) != b.to(t)))
        out[dtype] = (n_changed, n, size)
    return out


def delta_bytes(n_changed: int, elem_bytes: int) -> int:
    return n_changed * (INDEX_BYTES + elem_bytes)


def verdict(full_bytes: int, delta: int, send_s_per_byte: float, encode_s: float) -> dict:
    """The full sync's send time against the delta's encode + send, and the ratio (below 1: the delta pays)."""
    full_s, delta_s = full_bytes * send_s_per_byte, encode_s + delta * send_s_per_byte
    return {"full_s": full_s, "delta_s": delta_s, "ratio": delta_s / full_s}


def render(data: dict) -> str:
    lines = [f"Delta syncs, `{data['config']}` with every parameter trained and sent, lr {data['lr']:g}, {len(data['pairs'])} steps "
             f"(float32 master weights after each step; {data['elements'] / 1e6:.1f} M elements):", "",
             "| sent as | elements changed per step (median, range) | delta / full bytes | full send | delta encode + send | delta / full time |",
             "|---|---|---|---|---|---|"]
    for dtype in ("float32", "bfloat16"):
        fr = [p[dtype]["fraction"] for p in data["pairs"]]
        v = data["verdict"][dtype]
        lines.append(f"| {dtype} | {statistics.median(fr):.1%} ({min(fr):.1%}–{max(fr):.1%}) | {data['verdict'][dtype]['bytes_ratio']:.2f} | "
                     f"{v['full_s']:.2f} s | {v['delta_s']:.2f} s | **{v['ratio']:.2f}** |")
    lines += ["", f"Sending time per byte from the run's own full syncs (median {data['send_s']:.2f} s for {data['full_bytes_float32'] / 2**20:.0f} MiB); "
              f"encoding a delta (compare, find, gather over every tensor) {data['encode_s']:.2f} s on one core. "
              "A ratio below 1 would make delta syncs pay at this learning rate; above 1 they cost more than they save."]
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- measurement
def encode_time(before: dict, after: dict) -> float:
    """Seconds to build a sparse delta of `after` against `before` (every tensor: compare, nonzero, gather)."""
    import torch

    t0 = time.perf_counter()
    for name, a in after.items():
        flat_a, flat_b = a.reshape(-1), before[name].reshape(-1)
        idx = torch.nonzero(flat_a != flat_b).squeeze(1).to(torch.int32)
        flat_a[idx.long()].clone()
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/smollm2_word_problems.yaml")
    parser.add_argument("--lr", type=float, default=1e-6, help="learner.lr for full-parameter training (GRPO on LLMs: 1e-6 is usual)")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--keep", type=Path, default=None, help="the run directory (default bench/work/delta_sync_<config>)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args()
    import torch

    start = provenance(sys.argv[1:])
    stem = Path(args.config).stem
    run_dir = args.keep or ROOT / "bench" / "work" / f"delta_sync_{stem}"
    shutil.rmtree(run_dir, ignore_errors=True)
    run_asyncrl(ROOT / args.config, [f"run.output_dir={run_dir}", "learner.lora.rank=0", f"learner.lr={args.lr}", f"run.steps={args.steps}",
                                     "run.snapshot_every=1", "run.eval=false", "run.max_train_minutes=0", "logging.wandb=false",
                                     "run.checkpoint_every=0"])
    snaps = sorted((run_dir / "snapshots").glob("step-*.pt"))
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    send_s = statistics.median(m["time/weight_send_s"] for m in metrics if m.get("time/weight_send_s"))
    full_bytes = metrics[-1]["weights/sync_bytes"]
    pairs, prev = [], torch.load(snaps[0], map_location="cpu")
    for snap in snaps[1:]:
        cur = torch.load(snap, map_location="cpu")
        pairs.append({dtype: {"changed": c, "elements": n, "fraction": c / n} for dtype, (c, n, _) in changed(prev, cur).items()})
        last = (prev, cur)
        prev = cur
    encode_s = encode_time(*last)
    n = pairs[0]["float32"]["elements"]
    result = {"config": args.config, "lr": args.lr, "elements": n, "pairs": pairs, "send_s": send_s, "full_bytes_float32": full_bytes,
              "encode_s": encode_s, "verdict": {}}
    per_byte = send_s / full_bytes
    for dtype, size in (("float32", 4), ("bfloat16", 2)):
        c = statistics.median(p[dtype]["changed"] for p in pairs)
        delta = delta_bytes(int(c), size)
        result["verdict"][dtype] = {**verdict(n * size, delta, per_byte, encode_s), "bytes_ratio": delta / (n * size)}
    publish(args.out, f"delta_sync_{stem}", "delta_sync", result, sys.argv[1:], start)


if __name__ == "__main__":
    main()
