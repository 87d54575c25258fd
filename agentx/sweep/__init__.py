"""`agentx sweep`'s logic: the plan of cells (cells.py), the server behind each cell, obtained
through agentx.targets (servers.py), and the run over every cell that writes sweep.json and
hands the results to the Pareto report (run.py)."""
