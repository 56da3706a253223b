"""The learner in-process on a random tiny model: it learns, and batching does not change the update."""
import math

import pytest
import torch

from asyncrl.actors.learner import Learner
from asyncrl.core.batching import collate, first_response_position, group_indices, token_logprobs, token_logprobs_batched
from asyncrl.core.config import load_config


def fake_samples(n_groups=4, group_size=4):
    samples = []
    for g in range(n_groups):
        for i in range(group_size):
            response = [4 + (g + i) % 10, 5, 2]
            samples.append({
                "group_id": f"g{g}", "prompt_ids": [1, 4 + g, 14, 5, 15], "response_ids": response,
                "behavior_logprobs": [-2.0, -2.5, -3.0], "reward": float(i % 2), "policy_version_start": 0, "policy_version_end": 0,
                "finish_reason": "stop",
            })
    return samples


def learner(model_dir, *overrides):
    cfg = load_config(None, ["rollout.group_size=4", "learner.batch_size=16", "learner.lr=1e-2", "learner.grad_clip=0", *overrides])
    return Learner(cfg, model_dir)


def weights(lrn, which="policy") -> list[torch.Tensor]:
    """The learner's weights, whole (gathered from its FSDP shards), in parameter order."""
    return [w for w, _ in lrn.parameters_and_grads(which).values()]


def grads(lrn, which="policy") -> list[torch.Tensor]:
    """The gradients left by the last update, whole, in parameter order (frozen parameters left out)."""
    return [g for _, g in lrn.parameters_and_grads(which).values() if g is not None]


def test_collate_aligns_targets_and_masks():
    batch = collate(fake_samples(1, 2), pad_id=0)
    # prompt of 5 tokens, response of 3: targets 5..7 are response -> mask positions 4..6
    assert batch.response_mask[0].tolist() == [0, 0, 0, 0, 1, 1, 1]
    assert batch.behavior_logprobs[0, 4:].tolist() == [-2.0, -2.5, -3.0]
    assert batch.input_ids[0, 5:].tolist() == [4, 5, 2]
    assert batch.group_index.tolist() == [0, 0]


def test_train_step_changes_weights_and_reports_metrics(random_model_dir):
    lrn = learner(random_model_dir)
    before = weights(lrn)
    metrics = lrn.train_step(fake_samples(), version=0)
    changed = sum(not torch.equal(a, b) for a, b in zip(before, weights(lrn)))
    assert changed > 0
    for key in ("reward/mean", "reward/std", "kl/ref", "kl/ref_k1", "kl/ref_k2", "kl/ref_k3", "kl/behavior",
                "is_ratio/mean", "is_ratio/max", "is_ratio/ess", "loss/policy"):
        assert key in metrics
    assert metrics["reward/mean"] == 0.5 and metrics["kl/ref"] == 0.0  # first step: policy == reference


@pytest.mark.parametrize("loss_agg", ["token_mean", "seq_mean"])
def test_micro_batch_accumulation_matches_whole_batch(random_model_dir, loss_agg):
    whole = learner(random_model_dir, "learner.micro_batch_size=16", f"algorithm.loss_agg={loss_agg}")
    split = learner(random_model_dir, "learner.micro_batch_size=3", f"algorithm.loss_agg={loss_agg}")
    whole.train_step(fake_samples(), version=0)
    split.train_step(fake_samples(), version=0)
    # the accumulated gradient (left in .grad after the step) is the batch gradient either way;
    # weights are not compared: Adam divides near-zero gradients by their own size, so fp32
    # summation-order noise can move a single element by a visible fraction of lr
    assert len(grads(whole)) == len(weights(whole))
    for a, b in zip(grads(whole), grads(split)):
        assert a.abs().sum() > 0
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-4)


def ragged_samples():
    """fake_samples with responses of 1 to 6 tokens, so that micro-batches are cut to different widths."""
    samples = fake_samples()
    for k, s in enumerate(samples):
        n = 1 + (k * 5) % 6
        s["response_ids"] = [4 + (k + j) % 10 for j in range(n)]
        s["behavior_logprobs"] = [-2.0 - 0.1 * j for j in range(n)]
    return samples


@pytest.mark.parametrize("algo,extra", [("grpo", []), ("ppo", []), ("grpo", ["algorithm.kl_alert=1e9"])])
def test_length_sorted_trimmed_micro_batches_match_the_whole_batch(random_model_dir, algo, extra):
    # with a KL alert (never firing) the proximal and reference passes run before the update, micro-batched too
    whole = learner(random_model_dir, "learner.micro_batch_size=16", f"algorithm.name={algo}", *extra)
    split = learner(random_model_dir, "learner.micro_batch_size=3", f"algorithm.name={algo}", *extra)
    batch = collate(ragged_samples(), pad_id=0)
    assert batch.select(torch.tensor([0, 6])).trimmed().width < batch.width  # the trimming is exercised
    m_whole, m_split = whole.train_step(ragged_samples(), version=0), split.train_step(ragged_samples(), version=0)
    for a, b in zip(grads(whole), grads(split)):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-4)
    for a, b in zip(grads(whole, "critic"), grads(split, "critic")) if algo == "ppo" else ():
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-4)
    for key in ("loss/policy", "learner/entropy", "kl/behavior"):
        assert m_whole[key] == pytest.approx(m_split[key], rel=1e-4, abs=1e-6)
    assert m_whole["samples/response_len_max"] == 6 and m_whole["samples/response_len_p50"] == 4.0  # lengths 1,1,1,2,2,3,3,4,4,4,5,5,5,6,6,6


def test_passes_without_gradient_run_a_micro_batch_at_a_time_and_match_the_whole_batch(random_model_dir):
    lrn = learner(random_model_dir)
    batch = collate(ragged_samples(), pad_id=0)
    widths = []
    forward = lrn.model.forward
    lrn.model.forward = lambda *a, **kw: widths.append(tuple(kw["input_ids"].shape)) or forward(*a, **kw)
    with torch.no_grad():
        whole = token_logprobs(lrn.model, batch, 0.7, with_entropy=True)
    widths.clear()
    split = token_logprobs_batched(lrn.model, batch, 0.7, 3, with_entropy=True)
    assert [w[0] for w in widths] == [3, 3, 3, 3, 3, 1] and min(w[1] for w in widths) < batch.width + 1  # trimmed
    mask = batch.response_mask.bool()
    for a, b in zip(whole, split):
        assert b.shape == a.shape
        torch.testing.assert_close(b[mask], a[mask], atol=1e-5, rtol=1e-4)
    assert torch.all(split[0][~mask] == 0)


def test_logprobs_skip_the_prompt_positions_and_match_the_full_logits(random_model_dir):
    lrn = learner(random_model_dir)
    samples = ragged_samples()
    samples[0]["prompt_ids"] = [1, 4, 14, 5, 15, 6, 7]  # prompts of unequal length: the first response position is the shortest's
    batch = collate(samples, pad_id=0)
    kept = []
    forward = lrn.model.forward
    lrn.model.forward = lambda *a, **kw: kept.append(kw["logits_to_keep"]) or forward(*a, **kw)
    with torch.no_grad():
        lp, entropy = token_logprobs(lrn.model, batch, 0.7, with_entropy=True)
        full = torch.log_softmax(forward(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[:, :-1].float() / 0.7, -1)
    first = first_response_position(batch)
    assert first == 4 and kept == [batch.width + 1 - first]  # 5-token prompts: position 4 predicts the first answer token
    mask = batch.response_mask.bool()
    torch.testing.assert_close(lp[mask], full.gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1)[mask], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(entropy[mask], -(full.exp() * full).sum(-1)[mask], atol=1e-5, rtol=1e-4)
    assert lp.shape == entropy.shape == batch.response_mask.shape and torch.all(lp[~mask] == 0)


def test_a_micro_batch_with_no_loss_token_still_backpropagates(random_model_dir):
    lrn = learner(random_model_dir)
    batch = collate(fake_samples(1, 2), pad_id=0)
    batch.response_mask.zero_()  # every answer cut and masked (algorithm.mask_truncated)
    lp, _ = token_logprobs(lrn.model, batch, 1.0)
    lp.sum().backward()  # a graph, zero gradients: the update's accumulation loop needs no special case
    assert torch.all(lp == 0)


def test_mask_truncated_takes_cut_responses_out_of_the_loss(random_model_dir):
    samples = fake_samples()
    samples[1]["finish_reason"] = "length"
    batch = collate(samples, pad_id=0, mask_truncated=True)
    assert batch.response_mask[1].sum() == 0 and batch.response_mask[0].sum() == 3
    assert collate(samples, pad_id=0).response_mask[1].sum() == 3  # off by default
    other = [dict(s) for s in samples]
    other[1]["response_ids"] = [9, 9, 9, 9, 9]  # what a masked response says cannot matter; its reward still does
    other[1]["behavior_logprobs"] = [-5.0] * 5
    grad_sets = []
    for batch_samples in (samples, other):
        lrn = learner(random_model_dir, "algorithm.mask_truncated=true")
        lrn.train_step(batch_samples, version=0)
        grad_sets.append(grads(lrn))
    for a, b in zip(*grad_sets):
        torch.testing.assert_close(a, b, atol=1e-7, rtol=1e-5)


def test_mismatch_metrics_count_only_samples_of_the_weights_the_learner_holds(random_model_dir):
    lrn = learner(random_model_dir, "learner.sync_every=2")
    samples = fake_samples()
    for s in samples[:4]:
        s["policy_version_end"] = 1  # spans two versions: not the learner's sampling alone
    m = lrn.train_step(samples, version=0)
    assert m["mismatch/samples"] == 12 and m["mismatch/k3"] > 0 and m["mismatch/ratio_max"] > 0
    # the learner has taken a step it has not published (sync_every=2): no sample is its own now
    assert lrn.train_step(fake_samples(), version=0)["mismatch/samples"] == 0


def test_overlong_penalty_changes_the_advantages_not_the_recorded_reward(random_model_dir):
    samples = fake_samples()  # 3-token responses, rewards alternating 0, 1 in every group
    for s in samples[::2]:
        s["response_ids"] = s["response_ids"][:1]  # the reward-0 ones are short: only the long ones are penalised
        s["behavior_logprobs"] = s["behavior_logprobs"][:1]
    lrn = learner(random_model_dir, "rollout.max_new_tokens=3", "algorithm.overlong_penalty=1.0", "algorithm.overlong_buffer=2")
    m = lrn.train_step(samples, version=0)
    # 3 tokens with max 3 and buffer 2: penalty -1 on half the samples; 1 - 1 = 0 ties the short ones' 0
    assert m["reward/mean"] == 0.5 and m["reward/overlong_penalty_mean"] == pytest.approx(0.5)
    assert m["learner/advantage_abs_mean"] == 0.0 and all(s["reward"] in (0.0, 1.0) for s in samples)


@pytest.mark.parametrize("micro,minis", [(16, 1), (3, 1), (3, 2)])
def test_proximal_from_the_update_matches_a_separate_proximal_pass(random_model_dir, micro, minis):
    # the first mini-batch's forward passes give its pi_prox (with one mini-batch: no separate pass); a KL alert that
    # never fires forces the separate no-grad pass. Same gradients, same metrics, over two steps (the second off the first).
    fused = learner(random_model_dir, f"learner.micro_batch_size={micro}", f"learner.mini_batches={minis}")
    separate = learner(random_model_dir, f"learner.micro_batch_size={micro}", f"learner.mini_batches={minis}", "algorithm.kl_alert=1e9")
    groups = group_indices(fake_samples())
    first = fused._proximal_from_update(groups)  # the rows of the first update (drawn at random with two updates)
    assert int(first.sum()) == 16 // minis and first.nonzero().squeeze(-1).tolist() == sorted(fused.trainer._mini_batches(groups)[0].tolist())
    assert not separate._proximal_from_update(groups).any()
    for step in range(2):
        samples = fake_samples()
        if step:  # stale behaviour log-probs: the decoupled weights are not 1
            for s in samples:
                s["behavior_logprobs"] = [-1.0, -4.0, -2.0]
        m_fused, m_separate = fused.train_step(samples, version=step), separate.train_step(samples, version=step)
        for a, b in zip(grads(fused), grads(separate)):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-4)
        for key in ("kl/ref", "kl/ref_k1", "kl/behavior", "learner/entropy", "loss/policy", "is_ratio/mean", "is_ratio/max"):
            assert m_fused[key] == pytest.approx(m_separate[key], rel=1e-4, abs=1e-6), key
    assert m_fused["kl/ref"] > 0  # the second step's policy has moved off the reference


def test_correction_none_takes_every_rows_pi_prox_from_its_update_with_no_separate_pass(random_model_dir):
    # algorithm.correction=none: the loss weighs pi / pi_behav, so no pass recomputes pi_prox before the updates
    # (AReaL's recompute_logprob: false); the gradients are those of the run that recomputes it.
    args = ["learner.mini_batches=2", "learner.micro_batch_size=4", "algorithm.correction=none", "algorithm.kl_ref_every=0"]
    fused, separate = learner(random_model_dir, *args), learner(random_model_dir, *args, "algorithm.kl_alert=1e9")
    assert fused._proximal_from_update(group_indices(fake_samples())).all()
    passes = []
    forward = fused.model.forward
    fused.model.forward = lambda *a, **kw: passes.append(torch.is_grad_enabled()) or forward(*a, **kw)
    samples = fake_samples()
    for s in samples:
        s["behavior_logprobs"] = [-1.0, -4.0, -2.0]
    m_fused, m_separate = fused.train_step(samples, version=0), separate.train_step(samples, version=0)
    assert passes == [True] * 4  # 2 mini-batches of 2 micro-batches, each with gradient, and nothing else
    for a, b in zip(grads(fused), grads(separate)):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-4)
    assert m_fused["loss/policy"] == pytest.approx(m_separate["loss/policy"], rel=1e-4, abs=1e-6)
    assert m_fused["kl/behavior"] != pytest.approx(m_separate["kl/behavior"], rel=1e-6)  # the second mini-batch saw the moved policy


def test_reference_pass_every_n_steps_when_only_monitoring(random_model_dir):
    every_step = learner(random_model_dir)
    sparse = learner(random_model_dir, "algorithm.kl_ref_every=2")
    never_but_used = learner(random_model_dir, "algorithm.kl_ref_every=0", "algorithm.kl_coef=0.1")
    for step in range(3):
        m_every, m_sparse = every_step.train_step(fake_samples(), step), sparse.train_step(fake_samples(), step)
        assert ("kl/ref" in m_sparse) == (step % 2 == 0)
        if step % 2 == 0:
            assert m_sparse["kl/ref"] == pytest.approx(m_every["kl/ref"], abs=1e-7)
        for a, b in zip(grads(every_step), grads(sparse)):  # monitoring only: same update
            torch.testing.assert_close(a, b)
        assert "kl/ref" in never_but_used.train_step(fake_samples(), step)  # a KL penalty needs it every step


@pytest.mark.parametrize("algorithm", ["grpo", "ppo", "rloo", "reinforce_pp"])
def test_positive_advantage_raises_its_logprob(random_model_dir, algorithm):
    lrn = learner(random_model_dir, "learner.lr=1e-3", f"algorithm.name={algorithm}")
    samples = fake_samples()
    batch = collate(samples, 0)
    rewarded = torch.tensor([s["reward"] == 1.0 for s in samples])
    with torch.no_grad():
        lp0 = token_logprobs(lrn.model, batch, 1.0)[0].sum(-1)
    for _ in range(3):
        lrn.train_step(samples, version=0)
    with torch.no_grad():
        lp1 = token_logprobs(lrn.model, batch, 1.0)[0].sum(-1)
    gain = lp1 - lp0
    assert gain[rewarded].mean() > gain[~rewarded].mean()


def test_non_finite_loss_skips_the_update(random_model_dir):
    lrn = learner(random_model_dir)
    before = weights(lrn)
    samples = fake_samples()
    samples[0]["behavior_logprobs"] = [float("nan")] * 3
    metrics = lrn.train_step(samples, version=0)
    assert metrics["learner/skipped_updates"] == 1 and metrics["learner/skipped_total"] == 1
    assert all(torch.equal(a, b) for a, b in zip(before, weights(lrn)))


def test_kl_alert_reduces_lr(random_model_dir):
    lrn = learner(random_model_dir, "algorithm.kl_alert=1e-9", "algorithm.kl_action=reduce_lr")
    first = lrn.train_step(fake_samples(), version=0)  # policy == reference: KL 0, no alert
    second = lrn.train_step(fake_samples(), version=0)
    assert "alert/kl" not in first and second["alert/kl"] == 1.0
    assert second["learner/lr"] == pytest.approx(0.5e-2)


def test_kl_alert_rolls_back_to_last_good_weights(random_model_dir):
    lrn = learner(random_model_dir, "algorithm.kl_alert=1e-9", "algorithm.kl_action=rollback")
    initial = weights(lrn)
    lrn.train_step(fake_samples(), version=0)  # KL 0: snapshot the initial weights, then update
    assert not all(torch.equal(a, b) for a, b in zip(initial, weights(lrn)))
    metrics = lrn.train_step(fake_samples(), version=0)  # KL > threshold: back to the snapshot, no update
    assert metrics["alert/rolled_back"] == 1.0
    assert all(torch.equal(a, b) for a, b in zip(initial, weights(lrn)))


def test_ppo_trains_its_critic_towards_the_returns(random_model_dir):
    lrn = learner(random_model_dir, "algorithm.name=ppo", "learner.critic_lr=3e-3")
    policy_before = weights(lrn)
    first = lrn.train_step(fake_samples(), version=0)
    assert first["critic/value_mean"] == 0.0  # zero-initialised head
    for key in ("loss/value", "critic/grad_norm", "critic/explained_variance", "critic/return_mean", "loss/policy"):
        assert key in first
    for _ in range(15):
        last = lrn.train_step(fake_samples(), version=0)
    # half the rewards are 1: the value first learns their mean, which halves the squared error
    assert last["loss/value"] < 0.6 * first["loss/value"]
    assert abs(last["critic/value_mean"] - last["critic/return_mean"]) < 0.15
    assert not all(torch.equal(a, b) for a, b in zip(policy_before, weights(lrn)))


def test_ppo_micro_batch_accumulation_matches_whole_batch(random_model_dir):
    whole = learner(random_model_dir, "algorithm.name=ppo", "learner.micro_batch_size=16")
    split = learner(random_model_dir, "algorithm.name=ppo", "learner.micro_batch_size=5")
    for lrn in (whole, split):
        lrn.train_step(fake_samples(), version=0)
    for a, b in zip(grads(whole, "critic"), grads(split, "critic")):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-4)


def test_kl_penalty_in_reward_changes_the_advantages(random_model_dir):
    plain = learner(random_model_dir)
    shaped = learner(random_model_dir, "algorithm.kl_coef=1.0", "algorithm.kl_penalty=reward")
    for lrn in (plain, shaped):
        lrn.train_step(fake_samples(), version=0)  # policy moves away from the reference
    a = plain.train_step(fake_samples(), version=0)
    b = shaped.train_step(fake_samples(), version=0)
    assert a["kl/ref"] > 0
    assert a["learner/advantage_abs_mean"] != pytest.approx(b["learner/advantage_abs_mean"])


def test_save_policy_writes_the_weights_alone(random_model_dir, tmp_path):
    lrn = learner(random_model_dir)
    lrn.train_step(fake_samples(), version=0)
    path = lrn.save_policy(str(tmp_path / "step-000001.pt"))
    state = torch.load(path, weights_only=True)
    assert set(state) == set(lrn.model.state_dict())  # a bare state_dict: no optimizer, no counters
    for name, (tensor, _) in lrn.parameters_and_grads().items():
        assert torch.equal(state[name], tensor)
    assert not list(tmp_path.glob("*.tmp"))


def test_bf16_compute_with_a_small_lr_moves_the_fp32_master_weights_and_what_the_engines_get(random_model_dir):
    """lr 1e-6 is below bf16's resolution for weights of size ~0.02 (spacing ~1e-4): stepping bf16 weights directly
    rounds almost every update away. The fp32 master weights take every step; the bf16 copies the engines receive
    change where the accumulated steps cross a rounding boundary."""
    lrn = learner(random_model_dir, "model.dtype=bfloat16", "learner.lr=1e-6")
    master, sent = weights(lrn), dict(lrn.gathered_weights())
    assert all(w.dtype == torch.float32 for w in master) and all(t.dtype == torch.bfloat16 for t in sent.values())
    for step in range(3):
        lrn.train_step(fake_samples(), version=step)
    after, sent_after = weights(lrn), dict(lrn.gathered_weights())
    moved = sum(int((a != b).sum()) for a, b in zip(master, after)) / sum(a.numel() for a in master)
    assert moved > 0.9  # Adam moves every weight with a gradient by ~lr per step
    step_size = max(float((a - b).abs().max()) for a, b in zip(master, after))
    assert step_size < 1e-5  # ... by ~lr: the update is the small one asked for, not a rounding jump
    crossed = sum(int((sent[n] != sent_after[n]).sum()) for n in sent)
    assert crossed > 0  # the engines receive the change
    for name, tensor in sent_after.items():  # exactly the master weights rounded to bf16
        assert torch.equal(tensor, dict(zip(dict(lrn.model.named_parameters()), after))[name].to(torch.bfloat16))


def long_prompt_samples(n_groups=4, group_size=4, prompt_len=40):
    """ragged_samples with each group's prompt grown to `prompt_len` tokens (an agent's tools listing): worth sharing."""
    samples = ragged_samples()
    for s in samples:
        g = int(s["group_id"][1:])
        s["prompt_ids"] = [1] + [4 + (g * 7 + j * 3) % 11 for j in range(prompt_len - 1)]
    return samples


def test_micro_batches_keep_a_group_together_only_where_its_prompt_is_worth_sharing():
    from asyncrl.core.batching import micro_batches

    rows = torch.arange(16)
    short, long = collate(ragged_samples(), pad_id=0), collate(long_prompt_samples(), pad_id=0)
    assert any(len(set(short.group_index[m].tolist())) > 1 for m in micro_batches(short, rows, 4))  # 5-token prompts: by length
    grouped = micro_batches(long, rows, 4)
    assert all(len(set(long.group_index[m].tolist())) == 1 for m in grouped) and sorted(torch.cat(grouped).tolist()) == list(range(16))
    as_lists = lambda micros: [m.tolist() for m in micros]  # noqa: E731
    assert as_lists(micro_batches(long, rows, 4, share=False)) == as_lists(micro_batches(short, rows, 4))  # off: by length, as before


def test_a_pass_s_fixed_cost_keeps_one_big_pass_where_many_small_ones_would_cost_more(random_model_dir):
    """16 rows of 4 groups with 40-token prompts, micro-batches of 16: by positions alone the 4 grouped passes win
    (a prompt once each); counting each pass as 200 positions more, the one plain pass does. The cost is measured
    on the model: a pass's fixed part, in positions, and no gradients left behind."""
    from asyncrl.core.batching import Sharing, measured_pass_positions, micro_batches

    batch, rows = collate(long_prompt_samples(), pad_id=0), torch.arange(16)
    assert len(micro_batches(batch, rows, 16, True)) == len(micro_batches(batch, rows, 16, Sharing(0.0))) == 4
    assert len(micro_batches(batch, rows, 16, Sharing(200.0))) == 1
    assert len(micro_batches(batch, rows, 4, Sharing(200.0))) == 4  # as many passes either way: grouped still wins
    assert all(len(set(batch.group_index[m].tolist())) == 1 for m in micro_batches(batch, rows, 4, Sharing(200.0)))
    lrn = learner(random_model_dir)
    per_pass = measured_pass_positions(lrn.model, torch.device("cpu"))
    longest = min(512, lrn.model.config.max_position_embeddings)
    assert math.isfinite(per_pass) and 0 <= per_pass <= 8 * longest
    assert all(p.grad is None for p in lrn.model.parameters())


def test_a_pass_whose_time_does_not_grow_with_its_length_counts_as_all_fixed_cost_up_to_a_cap(monkeypatch):
    """Where the longer row takes no longer than the shorter (timer noise on a small model), the fit has no slope:
    the pass's fixed cost is 8 times the longer row's positions, not a division by almost zero (4e10 was seen)."""
    from types import SimpleNamespace

    import asyncrl.core.batching as batching

    clock = iter(range(1000))
    monkeypatch.setattr(batching.time, "perf_counter", lambda: float(next(clock)))  # every pass: 1 s, whatever its length
    model = lambda input_ids, logits_to_keep: SimpleNamespace(logits=torch.zeros(1, 1, 4))  # noqa: E731
    model.config, model.zero_grad = SimpleNamespace(max_position_embeddings=256), lambda set_to_none: None
    assert batching.measured_pass_positions(model, torch.device("cpu")) == 8 * 256


def test_a_model_whose_attention_cannot_share_a_prompt_is_micro_batched_by_length_with_nothing_measured(monkeypatch):
    """FlashAttention-2 takes no 4D mask and a sliding window has its own: the prompt would run once per row anyway,
    so grouping rows by prompt (and timing passes to weigh it) would only cost."""
    from types import SimpleNamespace

    import actors.learner_step as step
    from asyncrl.core.batching import packs
    from asyncrl.core.config import LearnerConfig

    measured = []
    monkeypatch.setattr(step, "measured_pass_positions", lambda model, device: measured.append(model) or 7.0)
    model = lambda **config: SimpleNamespace(config=SimpleNamespace(**config))  # noqa: E731
    assert packs(model(_attn_implementation="sdpa")) and packs(model(_attn_implementation="eager"))
    assert packs(model(_attn_implementation="sdpa", sliding_window=4096, use_sliding_window=False))
    for cannot in (model(_attn_implementation="flash_attention_2"), model(_attn_implementation="sdpa", sliding_window=4096)):
        assert not packs(cannot) and step.sharing(LearnerConfig(), cannot, torch.device("cpu")) is False
    assert measured == []
    assert step.sharing(LearnerConfig(), model(_attn_implementation="sdpa"), torch.device("cpu")).pass_positions == 7.0
    assert step.sharing(LearnerConfig(share_prompt=False), model(_attn_implementation="sdpa"), torch.device("cpu")) is False


def test_workers_of_a_learner_group_run_as_many_micro_batches_each_still_within_one_group():
    """Two workers' shards of the same batch can group into different numbers of micro-batches (a shard that cuts a
    group in two has one more); FSDP2 gathers every layer in each pass, so a worker running fewer would leave the
    other's collectives unmatched (gloo aborts the run). `agree` gives the group's largest count; each worker cuts to it."""
    from asyncrl.core.batching import micro_batches, split_to

    batch = collate(long_prompt_samples(), pad_id=0)
    shards = (torch.tensor([0, 1, 2, 3, 4, 5]), torch.tensor([6, 7, 8, 12, 13, 14]))  # rows of 2 groups vs of 3
    counts = [len(micro_batches(batch, rows, 4)) for rows in shards]
    assert counts[0] != counts[1]
    for rows in shards:
        micros = micro_batches(batch, rows, 4, agree=lambda n: max(counts))
        assert len(micros) == max(counts)
        assert sorted(torch.cat(micros).tolist()) == rows.tolist()
        assert all(len(set(batch.group_index[m].tolist())) == 1 for m in micros)
    assert [m.tolist() for m in split_to((torch.tensor([3, 1, 2]), torch.tensor([5])), 3)] == [[3, 1], [2], [5]]
    with pytest.raises(ValueError, match="cannot split 4 rows into 5"):
        split_to((torch.tensor([3, 1, 2]), torch.tensor([5])), 5)


def test_a_shared_prompt_runs_once_with_the_same_logprobs_and_gradients(random_model_dir):
    """One packed pass per micro-batch (its prompt once, then each row's tokens) gives the plain pass's log-probs and
    gradients; the model sees P + the rows' own tokens instead of rows x their width."""
    from asyncrl.core.batching import _packed_logits, first_response_position, shared_prefix

    lrn = learner(random_model_dir)
    sub = collate(long_prompt_samples(), pad_id=0).select(torch.arange(4)).trimmed()  # one group's rows
    P = shared_prefix(sub)
    assert P == 39 == first_response_position(sub)  # the whole prompt but its last token, whose logit the loss reads
    seen = []
    forward = lrn.model.forward
    lrn.model.forward = lambda *a, **kw: seen.append(tuple(kw["input_ids"].shape)) or forward(*a, **kw)
    results = []
    shapes = []
    for share in (False, True):
        lrn.model.zero_grad(set_to_none=True)
        seen.clear()
        lp, entropy = token_logprobs(lrn.model, sub, 0.7, with_entropy=True, share=share)
        shapes += seen
        lp.sum().backward()
        results.append((lp.detach(), entropy, [p.grad.clone() for p in lrn.model.parameters() if p.grad is not None]))
    lengths = sub.attention_mask.sum(-1)
    assert shapes == [tuple(sub.input_ids.shape), (1, P + int((lengths - P).sum()))]
    (lp0, ent0, g0), (lp1, ent1, g1) = results
    mask = sub.response_mask.bool()
    torch.testing.assert_close(lp1[mask], lp0[mask], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(ent1[mask], ent0[mask], atol=1e-5, rtol=1e-4)
    assert len(g0) == len(g1) > 0
    for a, b in zip(g0, g1):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-4)
    with torch.no_grad():  # the additive mask (eager attention) and the boolean one (SDPA) agree
        first = first_response_position(sub)
        torch.testing.assert_close(_packed_logits(lrn.model, sub, first, P, lengths, bool_mask=False),
                                   _packed_logits(lrn.model, sub, first, P, lengths, bool_mask=True), atol=1e-5, rtol=1e-4)


def test_a_step_with_shared_prompts_matches_one_without(random_model_dir):
    on = learner(random_model_dir, "learner.micro_batch_size=4", "learner.pass_overhead_tokens=0")  # positions alone: grouped
    off = learner(random_model_dir, "learner.micro_batch_size=4", "learner.share_prompt=false")
    m_on, m_off = on.train_step(long_prompt_samples(), version=0), off.train_step(long_prompt_samples(), version=0)
    for a, b in zip(grads(off), grads(on)):
        assert a.abs().sum() > 0
        torch.testing.assert_close(b, a, atol=1e-6, rtol=1e-4)
    for key in ("loss/policy", "learner/entropy", "kl/behavior", "is_ratio/mean"):
        assert m_on[key] == pytest.approx(m_off[key], rel=1e-4, abs=1e-6)


def test_mini_batches_draw_their_rows_at_random_per_step_and_the_same_on_every_worker():
    from actors.learner_step import mini_batch_rows

    minis = mini_batch_rows(64, 4, True, seed=0, step=3)
    rows = torch.cat(minis)
    assert [len(m) for m in minis] == [16] * 4 and sorted(rows.tolist()) == list(range(64))  # every row in one update
    assert rows.tolist() != list(range(64))  # not arrival order: the short groups that finish first are spread out
    assert all(torch.equal(a, b) for a, b in zip(minis, mini_batch_rows(64, 4, True, seed=0, step=3)))  # every worker, a rerun
    assert not torch.equal(rows, torch.cat(mini_batch_rows(64, 4, True, seed=0, step=4)))  # another step, another draw
    assert not torch.equal(rows, torch.cat(mini_batch_rows(64, 4, True, seed=1, step=3)))
    assert torch.cat(mini_batch_rows(64, 4, False, seed=0, step=3)).tolist() == list(range(64))  # learner.shuffle=false
    assert torch.cat(mini_batch_rows(16, 1, True, seed=0, step=3)).tolist() == list(range(16))  # one update: nothing to draw


def test_whole_group_mini_batches_draw_groups_at_random_and_keep_each_groups_rows_together():
    # learner.whole_groups (verl's mini-batches): 8 groups of 8 (rows of a group not adjacent, as a batch may hold them)
    # into 4 updates: each update holds 2 whole groups, the groups' order is drawn per step, the same on every worker.
    from actors.learner_step import mini_batch_rows

    groups = torch.arange(64) % 8
    minis = mini_batch_rows(64, 4, True, seed=0, step=3, groups=groups)
    rows = torch.cat(minis)
    assert sorted(rows.tolist()) == list(range(64)) and [len(m) for m in minis] == [16] * 4
    assert all(len(set(groups[m].tolist())) == 2 for m in minis)  # whole groups: 2 of them, 8 rows each
    assert all(groups[m].tolist() == sorted(groups[m].tolist(), key=groups[m].tolist().index) for m in minis)  # adjacent
    assert all(torch.equal(a, b) for a, b in zip(minis, mini_batch_rows(64, 4, True, seed=0, step=3, groups=groups)))
    assert not torch.equal(rows, torch.cat(mini_batch_rows(64, 4, True, seed=0, step=4, groups=groups)))  # another step
    for m in minis:  # a group's rows in their order
        for g in set(groups[m].tolist()):
            mine = m[groups[m] == g].tolist()
            assert mine == sorted(mine)
