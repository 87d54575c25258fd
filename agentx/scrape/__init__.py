"""Server-side collection: /metrics scraping and parsing (Prometheus text into snapshots and the
server_metrics block), the scrape child process, and GPU power sampling through NVML."""
