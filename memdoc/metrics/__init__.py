"""Prometheus / OpenMetrics export of the memory ledger, per device, process and rank."""
