"""memdoc's performance suite: `python -m benchmarks [--quick] [--only NAME]`."""
