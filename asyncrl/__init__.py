"""asyncrl: asynchronous, staleness-bounded RL post-training of language models on Ray."""

__version__ = "0.1.0"
