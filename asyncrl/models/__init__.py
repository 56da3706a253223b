"""Policy models: the tiny CPU-trainable addition model and resolution of local HF model dirs."""
