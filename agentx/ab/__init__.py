"""`agentx ab`: two server configurations, the same traffic, and whether the difference is real."""
