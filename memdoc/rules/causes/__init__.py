"""The rule catalogue: one module per documented root cause of running out of memory."""
