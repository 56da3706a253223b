"""asyncrl.orchestration.alerts: the console's alert lines, from metrics and batches (no Ray)."""
from __future__ import annotations

from asyncrl.core.config import load_config
from asyncrl.orchestration.alerts import FROZEN_AFTER, Alerts, all_cut_and_masked


def cut(n: int) -> list[dict]:
    return [{"finish_reason": "length"}] * n


def test_a_batch_is_frozen_only_when_every_answer_is_cut_and_masking_is_on():
    assert all_cut_and_masked(["length", "length"], True)
    assert not all_cut_and_masked(["length", "stop"], True)
    assert not all_cut_and_masked(["length", "length"], False)
    assert not all_cut_and_masked([], True)


def test_the_frozen_alert_comes_after_a_streak_names_the_remedies_and_repeats_every_ten():
    alerts = Alerts(load_config(None, ["algorithm.mask_truncated=true", "rollout.max_new_tokens=16"]))
    said = [bool(alerts.check(step, {}, cut(4))) for step in range(FROZEN_AFTER + 20)]
    assert [i for i, s in enumerate(said) if s] == [FROZEN_AFTER - 1, FROZEN_AFTER + 9, FROZEN_AFTER + 19]
    line = alerts.check(99, {}, cut(4))
    assert line == [] and alerts.frozen_streak == FROZEN_AFTER + 21
    assert alerts.check(100, {}, [{"finish_reason": "stop"}]) == [] and alerts.frozen_streak == 0  # one answer that ends resets it
    text = [alerts.check(s, {}, cut(2)) for s in range(FROZEN_AFTER)][-1][0]
    assert "3 batches in a row" in text and "rollout.max_new_tokens=16 " in text
    assert "algorithm.overlong_penalty" in text and "mask_truncated" in text


def test_without_masking_cut_batches_raise_no_alert():
    alerts = Alerts(load_config(None, ["algorithm.mask_truncated=false"]))
    assert not any(alerts.check(step, {}, cut(4)) for step in range(10))


def test_the_kl_alert_says_the_action():
    alerts = Alerts(load_config(None, ["algorithm.kl_alert=0.1", "algorithm.kl_action=rollback"]))
    assert alerts.check(3, {"kl/ref": 0.1234}, []) == []
    line = alerts.check(4, {"alert/kl": 1.0, "kl/ref": 0.25, "alert/rolled_back": 1.0}, [])
    assert line == ["asyncrl: ALERT step 4: kl/ref 0.2500 > 0.1 (rolled back to the last good weights)"]
    assert "(reduce_lr)" in Alerts(load_config(None, ["algorithm.kl_alert=0.1", "algorithm.kl_action=reduce_lr"])).check(
        5, {"alert/kl": 1.0, "kl/ref": 0.3}, [])[0]
