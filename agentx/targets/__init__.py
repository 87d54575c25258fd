"""One way to get a server: `open.open_server(choice)` on a choice whose `kind` names it
(choice.py: a URL, a recipe point on vLLM or on the simulator, the embedded simulator); each
gives a base.Target through the same lifecycle (process.py: launch, /health wait, stop)."""
