"""`python -m memdoc` is the `memdoc` command."""

from __future__ import annotations

from memdoc.cli.main import entry

entry()
