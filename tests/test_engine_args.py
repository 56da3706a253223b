"""The rollout engines' GPU options (rollout.tensor_parallel_size, rollout.cuda_graphs, rollout.gpu_memory_utilization):
the keyword arguments each engine is built with, on the CPU and on a GPU, and the config checks that tie them to
rollout.num_gpus. Fast: no Ray, no engine start, no GPU. The GPU arguments are only checked as arguments here;
none of them has run on a GPU (docs/engines-gpu.md)."""
import pytest

from asyncrl.actors import engine as vllm_mod
from asyncrl.actors import engines
from asyncrl.actors import sglang_engine as sglang_mod
from asyncrl.actors.engine import vllm_engine_args
from asyncrl.orchestration.weight_sync import weight_group_ranks
from asyncrl.actors.sglang_engine import sglang_engine_args
from asyncrl.core.config import ConfigError, load_config

BASE = ("/models/m", "bfloat16", 1024, 7, 0.8)  # model_path, dtype, max_model_len, seed, gpu_mem


# ---- vLLM ---------------------------------------------------------------------------


def test_vllm_cpu_args_are_the_ones_used_before():
    """CPU: exactly the arguments the engine had before these options (plus TP 1, vLLM's default)."""
    assert vllm_engine_args(*BASE, True, on_gpu=False) == dict(
        model="/models/m", dtype="bfloat16", max_model_len=1024, seed=7, enforce_eager=True, tensor_parallel_size=1,
        logprobs_mode="processed_logprobs", worker_extension_cls=vllm_mod.EXTENSION, gpu_memory_utilization=0.8,
        scheduling_policy="priority",
    )
    assert vllm_engine_args(*BASE, False)["scheduling_policy"] == "fcfs"


@pytest.mark.parametrize("cuda_graphs", [True, False])
def test_vllm_cpu_is_eager_with_one_rank_whatever_the_config(cuda_graphs):
    args = vllm_engine_args(*BASE, tensor_parallel_size=1, cuda_graphs=cuda_graphs, on_gpu=False)
    assert args["enforce_eager"] is True and args["tensor_parallel_size"] == 1
    assert "distributed_executor_backend" not in args


def test_vllm_cpu_refuses_tensor_parallelism_naming_the_key():
    with pytest.raises(ValueError, match=r"rollout\.tensor_parallel_size=2"):
        vllm_engine_args(*BASE, tensor_parallel_size=2, on_gpu=False)


def test_vllm_gpu_takes_the_configured_values():
    args = vllm_engine_args(*BASE, tensor_parallel_size=4, cuda_graphs=True, on_gpu=True)
    assert args["enforce_eager"] is False and args["tensor_parallel_size"] == 4 and args["gpu_memory_utilization"] == 0.8
    assert args["distributed_executor_backend"] == "mp"  # not Ray's executor inside the rollout pool's placement group
    eager = vllm_engine_args(*BASE, tensor_parallel_size=1, cuda_graphs=False, on_gpu=True)
    assert eager["enforce_eager"] is True and eager["tensor_parallel_size"] == 1
    assert "distributed_executor_backend" not in eager  # one rank: vLLM's own default (in-process)


def test_vllm_engine_constructor_refuses_tp_on_the_cpu_before_starting_vllm(monkeypatch):
    monkeypatch.setattr(vllm_mod, "cuda_available", lambda: False)
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")  # configure_cpu_env writes it; restored after the test
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    with pytest.raises(ValueError, match=r"rollout\.tensor_parallel_size=2"):
        vllm_mod.VLLMEngine(*BASE[:4], 1.0, BASE[4], tensor_parallel_size=2)


# ---- SGLang -------------------------------------------------------------------------


def test_sglang_cpu_args_are_the_ones_used_before():
    args = sglang_engine_args(*BASE, True, True, on_gpu=False, cpu_kv_tokens=4096)
    assert args == dict(
        model_path="/models/m", dtype="bfloat16", context_length=1024, random_seed=7, tp_size=1, skip_tokenizer_init=False,
        log_level="error", disable_cuda_graph=True, enable_priority_scheduling=True, schedule_low_priority_values_first=True,
        device="cpu", attention_backend="torch_native", max_total_tokens=4096,
    )
    assert "mem_fraction_static" not in args  # rollout.kv_cache_gib sizes the CPU cache


@pytest.mark.parametrize("cuda_graphs", [True, False])
def test_sglang_cpu_is_eager_with_one_rank_whatever_the_config(cuda_graphs):
    args = sglang_engine_args(*BASE, cuda_graphs=cuda_graphs, on_gpu=False, cpu_kv_tokens=1024)
    assert args["disable_cuda_graph"] is True and args["tp_size"] == 1


def test_sglang_cpu_refuses_tensor_parallelism_naming_the_key():
    with pytest.raises(ValueError, match=r"rollout\.tensor_parallel_size=2"):
        sglang_engine_args(*BASE, tensor_parallel_size=2, on_gpu=False, cpu_kv_tokens=1024)


def test_sglang_gpu_takes_the_configured_values():
    args = sglang_engine_args(*BASE, tensor_parallel_size=2, cuda_graphs=True, on_gpu=True)
    assert args["tp_size"] == 2 and args["disable_cuda_graph"] is False and args["mem_fraction_static"] == 0.8
    assert "device" not in args and "max_total_tokens" not in args and "attention_backend" not in args
    eager = sglang_engine_args(*BASE, cuda_graphs=False, on_gpu=True)
    assert eager["disable_cuda_graph"] is True and eager["tp_size"] == 1


def test_sglang_engine_constructor_refuses_tp_on_the_cpu_before_starting_sglang(monkeypatch):
    monkeypatch.setattr(sglang_mod, "check_installed", lambda: None)
    monkeypatch.setattr(sglang_mod, "cuda_available", lambda: False)
    with pytest.raises(ValueError, match=r"rollout\.tensor_parallel_size=2"):
        sglang_mod.SGLangEngine(*BASE[:4], 1.0, BASE[4], tensor_parallel_size=2)


# ---- make_engine, the rollout worker, the weight sync ---------------------------------


@pytest.mark.parametrize("name, cls", [("vllm", "VLLMEngine"), ("sglang", "SGLangEngine")])
def test_make_engine_passes_the_options_on(monkeypatch, name, cls):
    seen = {}

    class Fake:
        def __init__(self, *args, **kwargs):
            seen.update(args=args, kwargs=kwargs)

    monkeypatch.setattr(engines if name == "vllm" else sglang_mod, cls, Fake)
    engines.make_engine(name, *BASE[:4], 1.0, BASE[4], tensor_parallel_size=2, cuda_graphs=False)
    assert seen["kwargs"] == {"tensor_parallel_size": 2, "cuda_graphs": False} and seen["args"][5] == 0.8


def test_rollout_worker_builds_its_engine_from_the_config(monkeypatch):
    from asyncrl.actors.rollout import worker as rollout

    class Built(Exception):
        pass

    def fake_make_engine(*args, **kwargs):
        raise Built(args, kwargs)

    monkeypatch.setattr(rollout, "make_engine", fake_make_engine)
    cfg = load_config(None, ["rollout.num_gpus=2", "rollout.tensor_parallel_size=2", "rollout.cuda_graphs=false",
                             "rollout.gpu_memory_utilization=0.7"])
    with pytest.raises(Built) as built:
        rollout.RolloutWorker(0, cfg, "/models/m", buffer=None, run_id="r")
    args, kwargs = built.value.args
    assert args[6] == 0.7 and kwargs["tensor_parallel_size"] == 2 and kwargs["cuda_graphs"] is False


def test_the_weight_group_counts_every_tensor_parallel_rank():
    assert weight_group_ranks(3, 1) == (4, [1, 2, 3])  # learner rank 0, one rank per engine
    assert weight_group_ranks(2, 4) == (9, [1, 5])  # engine 1's workers join at 5, 6, 7, 8


# ---- config -------------------------------------------------------------------------


def test_config_defaults():
    r = load_config().rollout
    assert r.tensor_parallel_size == 1 and r.cuda_graphs is True and r.gpu_memory_utilization == 0.4


def test_config_refuses_tensor_parallelism_on_a_cpu_run():
    with pytest.raises(ConfigError) as err:
        load_config(None, ["rollout.tensor_parallel_size=2"])
    assert err.value.key == "rollout.tensor_parallel_size" and "rollout.num_gpus" in str(err.value)


def test_config_needs_a_gpu_per_tensor_parallel_rank():
    with pytest.raises(ConfigError) as err:
        load_config(None, ["rollout.num_gpus=1", "rollout.tensor_parallel_size=2"])
    assert err.value.key == "rollout.num_gpus" and "rollout.tensor_parallel_size" in str(err.value)
    cfg = load_config(None, ["rollout.num_gpus=2", "rollout.tensor_parallel_size=2"])
    assert cfg.rollout.tensor_parallel_size == 2


@pytest.mark.parametrize("override, key", [
    ("rollout.tensor_parallel_size=0", "rollout.tensor_parallel_size"),
    ("rollout.gpu_memory_utilization=0", "rollout.gpu_memory_utilization"),
    ("rollout.gpu_memory_utilization=1.5", "rollout.gpu_memory_utilization"),
    ("rollout.cuda_graphs=yes please", "rollout.cuda_graphs"),
])
def test_config_bounds_name_the_key(override, key):
    with pytest.raises(ConfigError) as err:
        load_config(None, [override])
    assert err.value.key == key


def test_cuda_graphs_off_is_accepted_on_the_cpu():
    assert load_config(None, ["rollout.cuda_graphs=false"]).rollout.cuda_graphs is False
