"""Fixtures shared by the importer tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.importers.snapshot_dicts import fragmented_snapshot, write_pickle


@pytest.fixture
def fragmented(tmp_path: Path) -> Path:
    """A snapshot pickle taken at an OOM that fragmentation caused (see fragmented_snapshot)."""
    return write_pickle(tmp_path / "snapshot.pickle", fragmented_snapshot())
