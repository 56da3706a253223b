"""bench/learner_phases.py's table from its data (no learner runs)."""
from tests.bench_modules import load


def test_render_gives_the_mini_batch_cost_and_the_second_threads_speedup():
    module = load("learner_phases")
    cases = [{"threads": t, "mini_batches": m, "batch": 16 * m, "step_s": [], "per_sample_s": s}
             for (t, m), s in {(1, 1): 1.2, (2, 1): 0.8, (1, 4): 1.8, (2, 4): 1.5}.items()]
    text = module.render({"config": "configs/x.yaml", "prompt": 100, "response": 45, "steps": 3, "cases": cases})
    assert "| 1 thread | 1.200 | 1.800 | 1.50x |" in text
    assert "| 2 threads | 0.800 | 1.500 | 1.88x |" in text
    assert "| second thread's speedup | 1.50x | 1.20x | |" in text
    cases += [{"threads": t, "mini_batches": 4, "correction": "none", "batch": 64, "step_s": [], "per_sample_s": s} for t, s in ((1, 1.5), (2, 1.0))]
    text = module.render({"config": "configs/x.yaml", "prompt": 100, "response": 45, "steps": 3, "cases": cases})
    assert "| 2 threads | 0.800 | 1.500 | 1.88x | 1.000 | 1.25x |" in text  # without the pass that recomputes pi_prox
    assert "| second thread's speedup | 1.50x | 1.20x | | 1.50x | |" in text
