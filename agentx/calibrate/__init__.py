"""`agentx calibrate`: measure a speculative-decoding draft's mean acceptance length (AL) per
thinking mode and K on a server with real verification, and write it to a golden AL file
that recipes with `synthetic_al: golden` read (docs/calibration.md).

config.py declares the options, servers.py gives one server per K (a recipe's vLLM or
simulator, or a URL), measure.py runs the prompts and reads the /metrics deltas, interval.py
the 95% interval, golden_merge.py writes or merges the golden YAML, flow.py ties them together.
"""
