"""The cache theory: the prefix-hit rates a trace allows at a KV pool and offload tier (tiers),
and where they collapse as lanes grow (cliff). It replays the trace through prompt synthesis and
the prefix-cache model, so it sits above prompt/ and trace/, not among the metrics over records."""
