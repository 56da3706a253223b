"""Bucket planning and the trajectory schema/store (pure, no Ray)."""
import pyarrow.parquet as pq
import pytest
import torch

from asyncrl.core.schema import SCHEMA_VERSION, new_sample
from asyncrl.core.store import TrajectoryStore, read_trajectories
from asyncrl.core.weights import TensorMeta, plan_buckets, tensor_meta


def test_buckets_respect_size_and_dtype():
    meta = [TensorMeta("a", "float32", (10,)), TensorMeta("b", "float32", (10,)), TensorMeta("c", "float32", (30,)),
            TensorMeta("d", "bfloat16", (4,)), TensorMeta("e", "float32", (1,))]
    # 80-byte buckets: a+b = 80 bytes fit; c (120 bytes) alone; dtype change splits d and e
    assert plan_buckets(meta, 80) == [[0, 1], [2], [3], [4]]
    assert plan_buckets(meta, 10**6) == [[0, 1, 2], [3], [4]]


def test_tensor_meta_from_named():
    meta = tensor_meta(iter([("w", torch.zeros(2, 3)), ("b", torch.zeros(3, dtype=torch.bfloat16))]))
    assert meta == [TensorMeta("w", "float32", (2, 3)), TensorMeta("b", "bfloat16", (3,))]
    assert meta[0].nbytes == 24 and meta[1].nbytes == 6


def test_store_appends_parts_and_reads_back(tmp_path):
    store = TrajectoryStore(tmp_path, flush_rows=2)
    rows = [new_sample(sample_id=f"s{i}", prompt_ids=[1, 2], response_ids=[3], behavior_logprobs=[-0.5], status="consumed") for i in range(3)]
    store.append(rows)  # 3 >= 2: one part written
    assert len(list(tmp_path.glob("part-*.parquet"))) == 1
    store.append([new_sample(sample_id="s3", status="dropped_stale")])
    store.flush()
    table = read_trajectories(tmp_path)
    assert table.column("sample_id").to_pylist() == ["s0", "s1", "s2", "s3"]
    assert set(table.column("schema_version").to_pylist()) == {SCHEMA_VERSION}
    assert not list(tmp_path.glob("*.tmp"))
    # a second store on the same directory continues the numbering (append-only)
    TrajectoryStore(tmp_path).append([new_sample(sample_id="s4")]) or None
    assert pq.read_table(sorted(tmp_path.glob("part-*.parquet"))[0]).num_rows == 3


def test_new_sample_rejects_unknown_fields():
    with pytest.raises(KeyError, match="bogus"):
        new_sample(bogus=1)


# ----------------------------------------------------------------------------- the engine's scoped reload
LLAMA_MODULES = {"", "model", "model.embed_tokens", "model.norm", "lm_head", "model.layers",
                 *{f"model.layers.{i}{leaf}" for i in range(3) for leaf in (
                     "", ".self_attn", ".self_attn.qkv_proj", ".self_attn.o_proj", ".self_attn.attn",
                     ".mlp", ".mlp.gate_up_proj", ".mlp.down_proj", ".input_layernorm", ".post_attention_layernorm")}}
"""vLLM's module names for a 3-layer Llama: q/k/v fused into qkv_proj, gate/up into gate_up_proj."""


def test_load_units_put_checkpoint_qkv_and_gate_up_in_their_fused_parents():
    from asyncrl.actors.vllm_ext import load_units

    names = [f"model.layers.2.self_attn.{p}_proj.weight" for p in "qkvo"] + [f"model.layers.2.mlp.{p}_proj.weight" for p in ("gate", "up", "down")]
    assert load_units(LLAMA_MODULES, names) == ["model.layers.2.mlp", "model.layers.2.self_attn"]
    # a layer's own module where it exists: the norms, o_proj alone
    assert load_units(LLAMA_MODULES, ["model.layers.1.self_attn.o_proj.weight", "model.norm.weight"]) == [
        "model.layers.1.self_attn.o_proj", "model.norm"]


def test_load_units_keep_the_outermost_and_fall_back_to_the_whole_model():
    from asyncrl.actors.vllm_ext import load_units

    names = ["model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.o_proj.weight"]
    assert load_units(LLAMA_MODULES, names) == ["model.layers.0.self_attn"]  # o_proj is inside self_attn's unit
    assert load_units(LLAMA_MODULES, ["unknown_tensor", *names]) == [""]  # a name no module holds: reload everything
