"""Files are recognised by their content, never their name, and read together as one run."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import pytest

from memdoc.importers import detect, import_files, load_any, save_trace
from tests.importers.snapshot_dicts import (
    HTA,
    OOM_SNAPSHOT,
    SMI_CAPTURES,
    SMI_XML,
    T0_US,
    XPLANE,
    fragmented_snapshot,
    write_pickle,
)


@pytest.mark.parametrize(
    ("source", "kind"),
    [
        pytest.param(OOM_SNAPSHOT, "torch-snapshot", id="snapshot"),
        pytest.param(SMI_XML / "tesla-t4.xml", "nvidia-smi", id="smi-xml"),
        pytest.param(SMI_CAPTURES / "query.txt", "nvidia-smi", id="smi-csv"),
        pytest.param(HTA / "memory_timeline.raw.gz", "torch-memory-timeline", id="timeline"),
        pytest.param(XPLANE, "tf-xplane", id="xplane"),
    ],
)
def test_a_misnamed_file_is_recognised_by_its_content(
    tmp_path: Path, source: Path, kind: str
) -> None:
    misnamed = tmp_path / "data.bin"
    shutil.copyfile(source, misnamed)
    assert detect(misnamed) == kind


def test_a_gzipped_log_is_read_like_the_plain_one(tmp_path: Path) -> None:
    packed = tmp_path / "smi.xml.gz"
    packed.write_bytes(gzip.compress((SMI_XML / "tesla-t4.xml").read_bytes()))
    assert detect(packed) == "nvidia-smi"
    trace = import_files([packed])
    assert trace.series("gpu.used", 0) is not None


@pytest.mark.parametrize(
    "content",
    [
        pytest.param(b"", id="empty"),
        pytest.param(b"hello, world\nthis is not a log\n", id="prose"),
        pytest.param(b'{"some": "json"}', id="other-json"),
        pytest.param(bytes(range(256)) * 10, id="binary"),
    ],
)
def test_anything_else_is_not_recognised(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "x"
    path.write_bytes(content)
    assert detect(path) is None


def test_load_any_keeps_memdoc_traces_and_converts_the_rest(tmp_path: Path) -> None:
    existing = tmp_path / "rank0.memdoc"
    save_trace(import_files([SMI_XML / "a10g.xml"]), existing)

    run = load_any([existing, OOM_SNAPSHOT, SMI_XML / "tesla-t4.xml"])

    assert len(run.traces) == 2
    converted, kept = run.traces
    assert kept.path == existing
    assert converted.series("torch.reserved", 0) is not None
    assert converted.series("gpu.used", 0) is not None
    assert converted.header.mode == "import"


def test_files_of_one_run_line_up_by_wall_clock(tmp_path: Path) -> None:
    snapshot = write_pickle(tmp_path / "s.pickle", fragmented_snapshot())  # starts at T0
    log = tmp_path / "smi.csv"
    log.write_text(
        "timestamp, index, memory.used [MiB]\n"
        "2025/11/24 16:00:00.500, 0, 300 MiB\n"
        "2025/11/24 15:59:59.000, 0, 100 MiB\n"
    )
    trace = import_files([snapshot, log])
    assert trace.header.created_unix == pytest.approx(T0_US / 1e6 - 1.0)
    used = trace.series("gpu.used", 0)
    allocated = trace.series("torch.allocated", 0)
    assert used is not None and allocated is not None
    assert list(used.times) == pytest.approx([0.0, 1.5])
    assert allocated.times[0] == pytest.approx(1.0)


def test_a_device_keeps_the_name_the_driver_gave_whatever_the_file_order() -> None:
    for files in (
        [OOM_SNAPSHOT, SMI_XML / "tesla-t4.xml"],
        [SMI_XML / "tesla-t4.xml", OOM_SNAPSHOT],
    ):
        trace = import_files(files)
        assert trace.devices_by_index[0].name == "Tesla T4"
        assert trace.devices_by_index[0].total_bytes == 15360 * 2**20
