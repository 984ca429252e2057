"""Configuration: defaults.yaml, hardware table, HF model configs, KV capacity, latency backends."""
