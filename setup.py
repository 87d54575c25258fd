"""Build shim for what pyproject.toml cannot say: the top-level traces/ and recipes/ directories
ship inside the package as `agentx._traces` and `agentx._recipes`, so a wheel install keeps the
built-in trace and the recipes (metadata and package data are in pyproject.toml)."""
from setuptools import find_packages, setup

setup(packages=[*find_packages(include=["agentx", "agentx.*"]), "agentx._traces",
                "agentx._recipes"],
      package_dir={"agentx._traces": "traces", "agentx._recipes": "recipes"})
