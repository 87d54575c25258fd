"""Recipes: one YAML per deployment -> the exact vLLM command (render) and its lifecycle (serve)."""
