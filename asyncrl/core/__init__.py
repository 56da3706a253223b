"""The library core: config, sample schema and trajectory store, staleness, tasks and rewards, weight buckets,
metrics, batching, LoRA, checkpoints, the learner group's collectives, and the models. It imports nothing from
actors/ or the orchestration above it (tests/test_layers.py)."""
