"""``blis observe``: a client that sends a generated workload to a real OpenAI-compatible
server and records what happened as a trace v2 (spec OBS-1..8, April reference)."""
