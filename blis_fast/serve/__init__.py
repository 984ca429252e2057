"""`blis serve`: a live simulated vLLM fleet behind an OpenAI-compatible HTTP endpoint
(`live`: the simulation that advances with the wall clock; `app`: the HTTP server;
`metrics`: vLLM's Prometheus metrics; `cli`: the command)."""
