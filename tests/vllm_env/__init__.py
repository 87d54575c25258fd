"""Real-vLLM (CPU build) test environment: venv, tiny model assets, server, fixtures."""
