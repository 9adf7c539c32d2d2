"""Post-mortem reports: the computed data, the HTML page, the terminal view, the summary."""
