"""Other tools' files, cut short or bit-flipped: `memdoc import` reads them or says no."""

from __future__ import annotations

import gzip
import random
from pathlib import Path

import pytest

from tests.conftest import FIXTURES
from tests.faults.cli_in_process import memdoc

IMPORTERS = FIXTURES / "importers"
# One real file of every kind memdoc imports; the large ones are only cut, early.
SMALL = [
    "nvidia-smi-xml/a100-sxm4-v12.xml",
    "nvidia-smi-captures/linux-x86_64__nvidia-h100-mig__590.48.01.txt",
    "nvidia-smi-captures/query.txt",
    "torch-snapshots-flexgen/oom_snapshot.pickle",
    "torch-profiler-hta/memory_timeline.raw.gz",
]
LARGE = [
    "tf-profiler-xplane/34.83.195.179_6003.xplane.pb",
    "torch-profiler-hta/df_index_resolver.json.gz",
]


def _flipped(data: bytes, seed: int) -> bytes:
    rng = random.Random(seed)
    damaged = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        bit = rng.randrange(len(damaged) * 8)
        damaged[bit // 8] ^= 1 << (bit % 8)
    return bytes(damaged)


def _variants(name: str) -> dict[str, bytes]:
    data = (IMPORTERS / name).read_bytes()
    if name in LARGE:
        return {f"cut-at-{size}": data[:size] for size in (0, 1, 10, 100, 1000, 30_000)}
    variants = {f"cut-at-{k}/20": data[: len(data) * k // 20] for k in range(20)}
    variants.update({f"flipped-{seed}": _flipped(data, seed) for seed in range(15)})
    body = gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data
    packed = gzip.compress(body, mtime=0)
    variants["gzip-cut"] = packed[: len(packed) // 2]
    variants["gzip-corrupt"] = packed[:20] + random.Random(0).randbytes(len(packed) - 20)
    return variants


@pytest.mark.parametrize("name", [pytest.param(n, id=Path(n).parent.name) for n in SMALL + LARGE])
def test_a_damaged_foreign_file_is_imported_or_refused_in_one_line_without_output(
    tmp_path: Path, name: str
) -> None:
    source = tmp_path / Path(name).name
    output = tmp_path / "out.memdoc"
    problems = []
    for label, content in _variants(name).items():
        source.write_bytes(content)
        output.unlink(missing_ok=True)

        said = memdoc("import", str(source), "-o", str(output))

        if said.status != 0 and not said.one_clear_error():
            problems.append(f"{label}: exit {said.status}, said {said.stderr!r}")
        if said.status != 0 and output.exists():
            problems.append(f"{label}: a refused import left {output.name}")
        if sorted(p.name for p in tmp_path.iterdir()) not in (
            [source.name],
            sorted([source.name, output.name]),
        ):
            problems.append(f"{label}: stray files {sorted(p.name for p in tmp_path.iterdir())}")
    assert problems == []
