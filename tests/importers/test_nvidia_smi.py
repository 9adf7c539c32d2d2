"""nvidia-smi output of every kind becomes gpu.used/free/total per device and gpu.proc_used per pid.

Expected values were read by eye from the files."""

from __future__ import annotations

from pathlib import Path

import pytest

from memdoc.importers import detect, import_files
from memdoc.trace import EventKind, Trace
from tests.importers.snapshot_dicts import SMI_CAPTURES, SMI_XML

MiB = 2**20


def _last(trace: Trace, metric: str, device: int, pid: int | None = None) -> float | None:
    series = trace.series(metric, device, pid)
    return series.values[-1] if series is not None and len(series) else None


# file -> [(name, total MiB, used MiB, free MiB) per physical GPU], processes listed
XML_FILES = {
    "a100-sxm4-v12.xml": ([("NVIDIA A100-SXM4-80GB", 81920, 50, 80999)], 0),
    "a10g.xml": ([("NVIDIA A10G", 23028, 22, 22569)], 1),
    "dual_2080-v13.xml": (
        [("NVIDIA GeForce RTX 2080", 8192, 1, 7786), ("NVIDIA GeForce RTX 2080", 8192, 1, 7786)],
        0,
    ),
    "dual_a5000-v13.xml": (
        [("NVIDIA RTX A5000", 24564, 22437, 1678), ("NVIDIA RTX A5000", 24564, 17253, 6862)],
        1,
    ),
    "gtx-1070-ti.xml": ([("GeForce GTX 1070 Ti", 4096, 42, 4054)], 0),
    "gtx-1660-ti.xml": ([("Graphics Device", 5912, 0, 5912)], 0),
    "pro-6000-maxq-blackwell-v13.xml": (
        [("NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition", 97887, 65720, 31531)],
        1,
    ),
    "quadro-p2000-v12.xml": ([("Quadro P2000", 5120, 1, 5051)], 0),
    "quadro-p400.xml": ([("Quadro P400", 1998, 0, 1998)], 0),
    "rtx-3060-v12.xml": ([("NVIDIA GeForce RTX 3060", 12288, 116, 11806)], 0),
    "rtx-3080-v12.xml": ([("NVIDIA GeForce RTX 3080", 10240, 1128, 8938)], 5),
    "rtx-3080-v13.xml": ([("NVIDIA GeForce RTX 3080", 10240, 9184, 660)], 0),
    "rtx-3090-v12.xml": ([("NVIDIA GeForce RTX 3090", 24576, 1, 24258)], 0),
    "rtx-4000-sff-ada-v13.xml": ([("NVIDIA RTX 4000 SFF Ada Generation", 20475, 3534, 16482)], 4),
    "tesla-t4.xml": ([("Tesla T4", 15360, 1032, 13939)], 2),
}


@pytest.mark.parametrize("name", sorted(XML_FILES))
def test_every_xml_schema_gives_each_gpus_memory(name: str) -> None:
    gpus, processes = XML_FILES[name]
    path = SMI_XML / name
    assert detect(path) == "nvidia-smi"

    trace = import_files([path])

    for index, (gpu_name, total, used, free) in enumerate(gpus):
        device = trace.devices_by_index[index]
        assert device.name == gpu_name
        assert device.total_bytes == total * MiB
        assert _last(trace, "gpu.total", index) == total * MiB
        assert _last(trace, "gpu.used", index) == used * MiB
        assert _last(trace, "gpu.free", index) == free * MiB
    assert len(trace.processes(ours=False)) == processes


def test_xml_processes_are_not_ours_and_carry_their_memory() -> None:
    trace = import_files([SMI_XML / "tesla-t4.xml"])
    assert {p.pid for p in trace.processes(ours=False)} == {675, 5762}
    assert _last(trace, "gpu.proc_used", 0, 5762) == 1005 * MiB
    assert trace.our_pids() == set()


def test_one_process_on_two_gpus_is_counted_on_each() -> None:
    trace = import_files([SMI_XML / "dual_a5000-v13.xml"])
    assert _last(trace, "gpu.proc_used", 0, 100477) == 22430 * MiB
    assert _last(trace, "gpu.proc_used", 1, 100477) == 17246 * MiB


def test_mig_instances_follow_the_physical_gpus() -> None:
    trace = import_files([SMI_XML / "a100-sxm4-v12.xml"])
    migs = [d for d in trace.devices() if d.parent_index is not None]
    assert [d.index for d in migs] == [1, 2, 3, 4]
    assert all(d.parent_index == 0 and d.total_bytes == 19968 * MiB for d in migs)
    assert _last(trace, "gpu.used", 3) == 12 * MiB


def test_an_xml_log_of_several_documents_is_memory_over_time(tmp_path: Path) -> None:
    one = (SMI_XML / "rtx-3080-v13.xml").read_text()
    later = one.replace("<used>9184 MiB</used>", "<used>100 MiB</used>")
    later = later.replace("10:23:01 2026", "10:23:06 2026", 1)
    log = tmp_path / "smi.log"
    log.write_text(one + later + one[: len(one) // 2])  # the last one cut short while written
    trace = import_files([log])
    used = trace.series("gpu.used", 0)
    assert used is not None
    assert [v / MiB for v in used.values] == [9184, 100]
    assert list(used.times) == [0.0, 5.0]


def test_xml_that_declares_entities_is_refused(tmp_path: Path) -> None:
    bomb = tmp_path / "bomb.xml"
    bomb.write_text(
        '<?xml version="1.0"?><!DOCTYPE x [<!ENTITY a "aaaa"><!ENTITY b "&a;&a;&a;">]>'
        "<nvidia_smi_log>&b;</nvidia_smi_log>"
    )
    from memdoc.errors import InputError

    with pytest.raises(InputError, match="entity"):
        import_files([bomb])


# capture -> (total MiB, used idle MiB, used under load MiB, load processes with memory)
CAPTURES = {
    "linux-x86_64__nvidia-geforce-rtx-2080-super__595.71.05.txt": (8192, 214, 819, 4),
    "linux-x86_64__nvidia-geforce-rtx-2080-super__610.57.04.txt": (8192, 211, 815, 4),
    "linux-x86_64__nvidia-geforce-rtx-4080-super__595.71.05.txt": (16376, 596, 1474, 7),
    "linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt": (81559, 0, 19818, 3),
    "linux-x86_64__nvidia-h100-mig__590.48.01.txt": (81559, 59, 11125, 3),
    "linux-x86_64__nvidia-h200-mig__590.48.01.txt": (143771, 55, 16959, 3),
    "linux-x86_64__nvidia-h200__590.48.01.txt": (143771, 0, 32362, 3),
    "linux-x86_64__nvidia-l40s__595.80.txt": (46068, 0, 1235, 2),
    "windows-x86_64__nvidia-geforce-rtx-2080-super__591.86.txt": (8192, 702, 1296, 0),
    "windows-x86_64__nvidia-geforce-rtx-2080-super__610.62.txt": (8192, 797, 1366, 0),
}


@pytest.mark.parametrize("name", sorted(CAPTURES))
def test_captures_give_idle_then_load_memory(name: str) -> None:
    total, idle, load, with_memory = CAPTURES[name]
    path = SMI_CAPTURES / name
    assert detect(path) == "nvidia-smi"

    trace = import_files([path])

    used = trace.series("gpu.used", 0)
    assert used is not None
    assert used.values[0] == idle * MiB
    assert used.values[-1] == load * MiB
    assert trace.device_total_bytes(0) == total * MiB
    pids = {k.pid for k in trace.series_keys() if k.metric == "gpu.proc_used"}
    assert len(pids) == with_memory


def test_on_windows_process_memory_is_unknown_not_zero() -> None:
    trace = import_files(
        [SMI_CAPTURES / "windows-x86_64__nvidia-geforce-rtx-2080-super__610.62.txt"]
    )
    assert len(trace.processes(ours=False)) >= 19
    assert not [k for k in trace.series_keys() if k.metric == "gpu.proc_used"]


def test_mig_processes_are_filed_under_their_instance() -> None:
    trace = import_files([SMI_CAPTURES / "linux-x86_64__nvidia-h200-mig__590.48.01.txt"])
    migs = {d.index: d for d in trace.devices() if d.parent_index == 0}
    assert len(migs) == 5
    # memhog and gpu_burn run in GPU instance 2, compute instance 1: the second MIG device
    assert _last(trace, "gpu.proc_used", 2, 12267) == 13526 * MiB
    assert _last(trace, "gpu.used", 2) == 16925 * MiB


def test_pmon_without_memory_columns_still_names_the_processes() -> None:
    trace = import_files([SMI_CAPTURES / "linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt"])
    commands = {p.pid: p.command for p in trace.processes(ours=False)}
    assert commands[11345] == ("./gpu_burn",)
    notes = " ".join(e.data["text"] for e in trace.events(EventKind.NOTE))
    assert "record with -s m" in notes
    assert "no time zone" in notes


# -- query CSV logs and dmon/pmon with memory columns --------------------------------------


def test_the_exporters_query_csv_without_timestamps() -> None:
    trace = import_files([SMI_CAPTURES / "query.txt"])
    assert trace.devices_by_index[1].name == "Some Other GPU"
    assert _last(trace, "gpu.used", 0) == 575 * MiB
    assert _last(trace, "gpu.used", 1) == 1234 * MiB


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(
            "timestamp, index, name, memory.used [MiB], memory.total [MiB]\n"
            "2025/01/02 10:00:00.000, 0, NVIDIA H200, 1000 MiB, 143771 MiB\n"
            "2025/01/02 10:00:00.000, 1, NVIDIA H200, 10 MiB, 143771 MiB\n"
            "2025/01/02 10:00:01.000, 0, NVIDIA H200, 2000 MiB, 143771 MiB\n"
            "2025/01/02 10:00:01.000, 1, NVIDIA H200, 20 MiB, 143771 MiB\n",
            id="with-units",
        ),
        pytest.param(
            "timestamp, index, name, memory.used [MiB], memory.total [MiB]\n"
            "2025/01/02 10:00:00.000, 0, NVIDIA H200, 1000, 143771\n"
            "2025/01/02 10:00:00.000, 1, NVIDIA H200, 10, 143771\n"
            "timestamp, index, name, memory.used [MiB], memory.total [MiB]\n"
            "2025/01/02 10:00:01.000, 0, NVIDIA H200, 2000, 143771\n"
            "2025/01/02 10:00:01.000, 1, NVIDIA H200, 20, 143771\n"
            "2025/01/02 10:00:02.000, 0, NVI",
            id="nounits-repeated-header-cut-short",
        ),
    ],
)
def test_query_gpu_logs_become_memory_over_time(tmp_path: Path, text: str) -> None:
    log = tmp_path / "gpu.csv"
    log.write_text(text)
    trace = import_files([log])
    for device, values in ((0, [1000, 2000]), (1, [10, 20])):
        used = trace.series("gpu.used", device)
        assert used is not None and [v / MiB for v in used.values] == values
        assert list(used.times) == [0.0, 1.0]
    assert trace.devices_by_index[0].total_bytes == 143771 * MiB


def test_query_compute_apps_logs_give_per_process_memory(tmp_path: Path) -> None:
    log = tmp_path / "apps.csv"
    log.write_text(
        "timestamp, gpu_uuid, pid, process_name, used_gpu_memory [MiB]\n"
        "2025/01/02 10:00:00.000, GPU-aaa, 4242, python train.py --name a,b, 3000 MiB\n"
        "2025/01/02 10:00:05.000, GPU-aaa, 4242, python train.py --name a,b, 5000 MiB\n"
    )
    trace = import_files([log])
    (proc,) = trace.processes(ours=False)
    assert proc.command == ("python train.py --name a, b",)
    assert trace.devices_by_index[0].uuid == "GPU-aaa"
    used = trace.series("gpu.proc_used", 0, 4242)
    assert used is not None and [v / MiB for v in used.values] == [3000, 5000]


def test_dmon_and_pmon_with_memory_columns(tmp_path: Path) -> None:
    log = tmp_path / "dmon.txt"
    log.write_text(
        "# Date       Time        gpu     fb   bar1   ccpm\n"
        "# YYYYMMDD   HH:MM:SS    Idx     MB     MB     MB\n"
        " 20250102   10:00:00      0    485      5      0\n"
        " 20250102   10:00:00      1     10      5      0\n"
        " 20250102   10:00:01      0    900      5      0\n"
        " 20250102   10:00:01      1     10      5      0\n"
    )
    pmon = tmp_path / "pmon.txt"
    pmon.write_text(
        "# gpu         pid   type     fb   ccpm  command\n"
        "# Idx           #    C/G     MB     MB  name\n"
        "    0       4242     C    300      0  python\n"
        "    0          -     -      -      -  -\n"
        "    0       4242     C    700      0  python\n"
    )
    trace = import_files([log, pmon])
    used = trace.series("gpu.used", 0)
    assert used is not None and [v / MiB for v in used.values] == [485, 900]
    assert list(used.times) == [0.0, 1.0]
    proc = trace.series("gpu.proc_used", 0, 4242)
    assert proc is not None and [v / MiB for v in proc.values] == [300, 700]
