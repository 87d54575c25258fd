"""The run verdict: does summary.json measure what the run configuration promised (pass, fail,
insufficient, interrupted)."""
