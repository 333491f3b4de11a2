"""What a run measured: the records, log and /metrics parsing, crossovers and recommendations, and
the reports (JSON, CSV, Markdown, plot)."""
