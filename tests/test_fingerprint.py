"""Fingerprints of weights (asyncrl.core.fingerprint): the same on every process, linear, so a fused layer's is its
parts' one after the other, and compared within the served dtype's rounding."""
import math

import pytest
import torch

from asyncrl.core.fingerprint import WeightMismatch, first_mismatch, fingerprint, locate, probe_vector
from asyncrl.core.messages import LoadReport
from asyncrl.orchestration.weight_sync import verify


def test_the_probe_vector_is_fixed_by_its_length_and_exact_in_bf16():
    a, b = probe_vector(576), probe_vector(576)
    assert torch.equal(a, b) and set(a.tolist()) == {-1.0, 1.0}
    assert not torch.equal(probe_vector(576), probe_vector(577)[:576])
    assert torch.equal(probe_vector(64, torch.bfloat16).float(), probe_vector(64))


def test_a_fused_layer_fingerprints_as_its_parts_one_after_the_other():
    q, k, v = torch.randn(8, 16), torch.randn(4, 16), torch.randn(4, 16)
    fused = fingerprint(torch.cat([q, k, v]))
    assert torch.allclose(fused, torch.cat([fingerprint(q), fingerprint(k), fingerprint(v)]))
    # the engine's way: the layer applied to the probe vector, the same numbers
    layer = torch.nn.Linear(16, 16, bias=False)
    layer.weight.data = torch.cat([q, k, v])
    assert torch.allclose(layer(probe_vector(16)[None])[0], fused, atol=1e-5)


def test_bf16_rounding_matches_and_a_changed_tensor_does_not():
    torch.manual_seed(0)
    w = torch.randn(64, 576)
    sent = {"a.weight": fingerprint(w.bfloat16()), "b.weight": fingerprint(torch.randn(3))}
    # served through a bf16 kernel: the product rounded to bf16
    served_bf16 = (w.bfloat16() @ probe_vector(576, torch.bfloat16)).float()
    assert first_mismatch(sent, {"a.weight": served_bf16, "b.weight": sent["b.weight"]}, "bfloat16") is None
    garbled = w.bfloat16().clone()
    garbled[5, 100] += 1.0  # one element, by one standard deviation
    for dtype in ("bfloat16", "float32"):
        m = first_mismatch(sent, {"a.weight": fingerprint(garbled), "b.weight": sent["b.weight"]}, dtype)
        assert m is not None and m.name == "a.weight" and m.row == 5 and m.excess > 1
    merged = w.bfloat16() + 0.02 * torch.randn(64, 576).bfloat16()  # a LoRA merge of the size a few steps make
    assert first_mismatch({"a.weight": fingerprint(merged)}, {"a.weight": served_bf16}, "bfloat16") is not None


def test_the_first_tensor_that_differs_in_the_sync_order_is_named():
    sent = {n: fingerprint(torch.randn(4, 4)) for n in ("x", "y", "z")}
    served = dict(sent, y=sent["y"] * 2, z=sent["z"] * 3)
    assert first_mismatch(sent, served, "float32").name == "y"
    missing = first_mismatch(sent, {"x": sent["x"]}, "float32")
    assert missing.name == "y" and math.isinf(missing.excess) and "no such weight" in missing.describe()
    nan = first_mismatch({"x": sent["x"]}, {"x": sent["x"] * float("nan")}, "float32")
    assert nan is not None and math.isinf(nan.excess)


def test_checking_every_other_row_skips_the_rest_and_catches_a_wrong_row_on_its_phase():
    torch.manual_seed(0)
    w, norm = torch.randn(10, 32), torch.randn(32)
    half = fingerprint(w, 2, 1)
    assert half[0::2].isnan().all() and torch.allclose(half[1::2], fingerprint(w)[1::2])
    assert torch.equal(fingerprint(norm, 2, 1), fingerprint(norm))  # a 1-D tensor: always checked
    garbled = w.clone()
    garbled[4] += 1.0  # a row of phase 0
    served = {"w": fingerprint(garbled)}
    assert first_mismatch({"w": fingerprint(w, 2, 1)}, served, "float32") is None  # not checked this sync
    m = first_mismatch({"w": fingerprint(w, 2, 2)}, served, "float32")  # the next sync's phase (2 % 2 = 0)
    assert m is not None and m.name == "w" and m.row == 4
    everywhere = {"w": fingerprint(w * 1.5)}  # wrong in every row: caught on either phase
    assert all(first_mismatch({"w": fingerprint(w, 2, p)}, everywhere, "float32") is not None for p in (0, 1))
    nan_row = fingerprint(w)
    nan_row[3] = float("nan")  # the engine serves NaN on a checked row
    assert first_mismatch({"w": fingerprint(w, 2, 1)}, {"w": nan_row}, "float32").row == 3


def test_weights_the_learner_sent_as_nan_are_a_mismatch_not_a_row_left_unchecked():
    torch.manual_seed(0)
    w = torch.randn(10, 32)
    w[3, 7] = float("nan")  # a checked row of phase 1
    w[4, 0] = float("nan")  # a row of phase 0, not checked at phase 1
    sent = fingerprint(w, 2, 1)
    assert sent[0::2].isnan().all() and math.isinf(sent[3]) and sent[1::2].isfinite().sum() == 4
    for served in (fingerprint(w), fingerprint(torch.nan_to_num(w))):  # the engine serves the NaN, or a finite row
        m = first_mismatch({"w": sent}, {"w": served}, "float32")
        assert m is not None and m.row == 3 and m.learner_side and "the learner sent is not finite" in m.describe()
        assert str(WeightMismatch(1, 7, m)).startswith("the learner sent weight version 7 with non-finite values")
    assert not first_mismatch({"w": fingerprint(w[5:], 2, 0)}, {"w": fingerprint(w[5:] * 2)}, "float32").learner_side
    assert math.isinf(fingerprint(torch.tensor([1.0, float("nan")]))[0])  # a 1-D tensor too


class _Fused(torch.nn.Module):
    def __init__(self, sizes):
        super().__init__()
        self.output_sizes = sizes


def test_locate_finds_a_checkpoint_tensor_inside_its_fused_module():
    modules = {"model.layers.0.self_attn.qkv_proj": _Fused([8, 4, 4]), "model.layers.0.self_attn.o_proj": object(),
               "model.layers.0.mlp.gate_up_proj": _Fused([32, 32]), "model.norm": object()}
    packed = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}
    assert locate(modules, packed, "model.layers.0.self_attn.k_proj.weight") == ("model.layers.0.self_attn.qkv_proj", "weight", 8, 4)
    assert locate(modules, packed, "model.layers.0.self_attn.v_proj.bias") == ("model.layers.0.self_attn.qkv_proj", "bias", 12, 4)
    assert locate(modules, packed, "model.layers.0.mlp.up_proj.weight") == ("model.layers.0.mlp.gate_up_proj", "weight", 32, 32)
    assert locate(modules, packed, "model.norm.weight") == ("model.norm", "weight", 0, None)
    with pytest.raises(KeyError):
        locate(modules, packed, "model.layers.0.mlp.down_proj.weight")


def test_verify_names_the_engine_and_version_and_counts_engines_that_cannot_fingerprint():
    sent = {"w": fingerprint(torch.randn(4, 4))}
    reports = {0: LoadReport(3, 0.2, 64, sent, 0.01), 1: LoadReport(3, 0.3, 64, {"w": sent["w"] + 1}, 0.02),
               2: LoadReport(3, 0.1, 64, None, 0.0)}
    settled = verify(3, sent, reports, "float32", spent_s=0.05)
    assert settled.load_s == 0.3 and settled.verified == 2 and settled.unverified == 1
    assert [m.engine for m in settled.mismatched] == [1]
    assert settled.verify_s == pytest.approx(0.07)  # the learner's 0.05 and the slowest engine's 0.02, apart too
    assert (settled.metrics()["verify_learner_s"], settled.metrics()["verify_engine_s"]) == pytest.approx((0.05, 0.02))
    err = settled.mismatched[0]
    assert isinstance(err, WeightMismatch) and "rollout worker 1" in str(err) and "version 3" in str(err) and "w:" in str(err)
    assert settled.metrics()["verified"] == pytest.approx(2 / 3) and settled.metrics()["mismatches"] == 1
    assert "verified" not in verify(3, None, reports, "float32").metrics()  # not verifying


def test_non_finite_weights_from_the_learner_stop_the_run_whatever_the_mismatch_action():
    """Replacing an engine or sending the version again cannot help when what the learner sent is not finite: the
    fleet stops at once, naming the learner, and replaces nothing."""
    from types import SimpleNamespace

    from asyncrl.orchestration.fleet import Fleet

    w = torch.randn(4, 4)
    bad = w.clone()
    bad[2, 1] = float("nan")
    sent = {"w": fingerprint(bad)}
    for action in ("replace", "resend", "stop"):
        replaced = []
        settled = verify(5, sent, {0: LoadReport(5, 0.1, 64, {"w": fingerprint(w)}, 0.0)}, "float32")
        fleet = SimpleNamespace(sync=SimpleNamespace(collect=lambda s=settled: s), on_mismatch=action, mismatches=0,
                                replace_worker=lambda i, why: replaced.append(i), _publish=lambda: None)
        with pytest.raises(WeightMismatch, match="the learner sent weight version 5 with non-finite values"):
            Fleet.settle_weights(fleet)
        assert replaced == [] and fleet.mismatches == 1
