"""agentx: replay agentic-coding traces against LLM inference servers and measure them."""

__version__ = "0.1.0"
