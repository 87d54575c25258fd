"""One way to get a server: a URL (base.UrlServer), a recipe point on vLLM or on the simulator
(recipe.RecipeServer), or the embedded simulator (embedded.EmbeddedSim); each gives a
base.Target through the same lifecycle (process.py: launch, /health wait, stop)."""
