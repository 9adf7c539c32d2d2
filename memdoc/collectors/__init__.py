"""Collectors: one module per backend, each behind a cheap availability probe."""
