"""Measure how long a large snapshot takes to analyse and how much memory that needs.

Not part of the test suite (it takes minutes and gigabytes). Usage:

    python tests/importers/large_snapshot_probe.py FOLDER [MEGABYTES]

It writes FOLDER/large.pickle, a snapshot in PyTorch 2.1+ form (shared frame lists, times,
an OOM entry), streamed opcode by opcode so that writing it needs little memory, then runs
each step in a fresh process and prints its wall time and peak RSS.
"""

from __future__ import annotations

import random
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import BinaryIO

MiB = 1024**2
BYTES_PER_ENTRY = 68  # measured on what this writer produces


class _Writer:
    """Writes pickle protocol 4 opcodes, memoizing strings so they are written once."""

    def __init__(self, out: BinaryIO) -> None:
        self.out = out
        self.memo = 0
        self.strings: dict[str, int] = {}

    def op(self, data: bytes) -> None:
        self.out.write(data)

    def memoize(self) -> int:
        self.op(b"\x94")
        self.memo += 1
        return self.memo - 1

    def get(self, index: int) -> None:
        self.op(b"h" + bytes([index]) if index < 256 else b"j" + struct.pack("<I", index))

    def string(self, text: str) -> None:
        if text in self.strings:
            self.get(self.strings[text])
            return
        data = text.encode()
        self.op(b"\x8c" + bytes([len(data)]) + data)
        self.strings[text] = self.memoize()

    def integer(self, value: int) -> None:
        if 0 <= value < 256:
            self.op(b"K" + bytes([value]))
        elif -(2**31) <= value < 2**31:
            self.op(b"J" + struct.pack("<i", value))
        else:
            data = value.to_bytes((value.bit_length() + 8) // 8, "little", signed=True)
            self.op(b"\x8a" + bytes([len(data)]) + data)

    def dict_start(self) -> int:
        self.op(b"}")
        index = self.memoize()
        self.op(b"(")
        return index

    def dict_end(self) -> None:
        self.op(b"u")

    def pair(self, key: str, value: int | str) -> None:
        self.string(key)
        if isinstance(value, str):
            self.string(value)
        else:
            self.integer(value)


def write_snapshot(path: Path, target_bytes: int, seed: int = 1) -> int:
    """A snapshot of about `target_bytes`; returns the number of trace entries."""
    rng = random.Random(seed)
    entries = max(1000, target_bytes // BYTES_PER_ENTRY)
    with open(path, "wb", buffering=8 * MiB) as out:
        w = _Writer(out)
        w.op(b"\x80\x04")
        w.dict_start()
        stacks = _frames(w, rng)
        w.string("segments")
        _segments(w, rng, stacks)
        w.string("device_traces")
        w.op(b"]")
        w.memoize()
        w.op(b"]")
        w.memoize()
        _entries(w, rng, stacks, entries)
        w.op(b"a")  # the device's trace into device_traces
        w.string("allocator_settings")
        w.dict_start()
        w.pair("PYTORCH_CUDA_ALLOC_CONF", "")
        w.pair("expandable_segments", 0)
        w.dict_end()
        w.dict_end()
        w.op(b".")
    return entries


def _frames(w: _Writer, rng: random.Random) -> list[int]:
    """2000 distinct stacks of 40 frames over 5000 frame dicts, as PyTorch dedups them. They
    are built once, in an extra key of the snapshot, and referred to from the memo after."""
    frame_memo: list[int] = []
    w.string("frame_pool")
    w.op(b"]")
    w.memoize()
    w.op(b"(")
    for i in range(5000):
        frame_memo.append(w.dict_start())
        library = i % 3 != 0
        folder = "/venv/lib/python3.11/site-packages/torch/nn" if library else "/home/u/proj"
        w.pair("filename", f"{folder}/mod{i % 97}.py")
        w.pair("line", i)
        w.pair("name", f"function_{i}")
        w.dict_end()
    stacks: list[int] = []
    for _ in range(2000):
        w.op(b"]")
        stacks.append(w.memoize())
        w.op(b"(")
        for _ in range(40):
            w.get(rng.choice(frame_memo))
        w.op(b"e")
    w.op(b"e")
    return stacks


def _segments(w: _Writer, rng: random.Random, stacks: list[int]) -> None:
    w.op(b"]")
    w.memoize()
    w.op(b"(")
    address = 0x7F00_0000_0000
    for _ in range(2000):
        sizes = [rng.choice((2, 4, 8, 16)) * MiB for _ in range(rng.randint(1, 10))]
        w.dict_start()
        w.pair("device", 0)
        w.pair("address", address)
        w.pair("total_size", sum(sizes))
        w.pair("stream", 0)
        w.pair("segment_type", "large")
        w.pair("is_expandable", 0)
        w.string("blocks")
        w.op(b"]")
        w.memoize()
        w.op(b"(")
        for size in sizes:
            state = rng.choice(("active_allocated", "active_allocated", "inactive"))
            w.dict_start()
            w.pair("address", address)
            w.pair("size", size)
            w.pair("requested_size", size - 512)
            w.pair("state", state)
            w.string("frames")
            w.get(rng.choice(stacks))
            w.dict_end()
            address += size
        w.op(b"e")
        w.dict_end()
    w.op(b"e")


def _entries(w: _Writer, rng: random.Random, stacks: list[int], count: int) -> None:
    """Rounds of 64 allocations then their frees, then an OOM."""
    t_us = 1_764_000_000_000_000
    base = 0x7E00_0000_0000
    written = 0
    w.op(b"(")
    while written < count - 1:
        live = []
        for slot in range(64):
            addr = base + slot * 64 * MiB
            size = rng.randint(1, 32) * MiB
            _entry(w, "alloc", addr, size, t_us, rng.choice(stacks))
            live.append((addr, size))
            t_us += 3
        for addr, size in live:
            _entry(w, "free_requested", addr, size, t_us, rng.choice(stacks))
            _entry(w, "free_completed", addr, size, t_us + 1, rng.choice(stacks))
            t_us += 3
        written += 3 * 64
        if written % 64_000 < 192:
            w.op(b"e(")  # append in batches, as pickle does
    w.dict_start()
    w.pair("action", "oom")
    w.pair("device_free", 10 * MiB)
    w.pair("size", 2048 * MiB)
    w.pair("stream", 0)
    w.pair("time_us", t_us)
    w.string("frames")
    w.get(stacks[0])
    w.dict_end()
    w.op(b"e")


def _entry(w: _Writer, action: str, addr: int, size: int, t_us: int, stack: int) -> None:
    w.dict_start()
    w.pair("action", action)
    w.pair("addr", addr)
    w.pair("size", size)
    w.pair("stream", 0)
    w.pair("time_us", t_us)
    w.string("frames")
    w.get(stack)
    w.pair("compile_context", "N/A")
    w.pair("user_metadata", "")
    w.dict_end()


_STEPS = {
    "pickle.load (unchecked, for comparison)": (
        "import pickle, sys; pickle.load(open(sys.argv[1], 'rb'))"
    ),
    "load_plain_pickle (vetted)": (
        "import sys; from memdoc.importers.safe_pickle import load_plain_pickle;"
        "load_plain_pickle(sys.argv[1])"
    ),
    "read_snapshot (vetted, parsed)": (
        "import sys; from memdoc.importers.torch_snapshot import read_snapshot;"
        "read_snapshot(sys.argv[1])"
    ),
    "analyse_snapshot_file": (
        "import sys; from memdoc.importers.allocations import analyse_snapshot_file;"
        "a = analyse_snapshot_file(sys.argv[1]); print('   ', a.at_peak.top[0].label)"
    ),
    "memdoc import": (
        "import sys; from memdoc.cli.main import main;"
        "main(['import', sys.argv[1], '-o', sys.argv[1] + '.memdoc', '--force'])"
    ),
}
_REPORT_RSS = (
    "; print('rss_kib', int(next(l.split()[1] for l in open('/proc/self/status')"
    " if l.startswith('VmHWM:'))))"
)


def measure(path: Path) -> None:
    for name, code in _STEPS.items():
        start = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-c", code + _REPORT_RSS, str(path)],
            check=True,
            capture_output=True,
            text=True,
        )
        wall_s = time.perf_counter() - start
        rss_kib = int(done.stdout.rsplit("rss_kib", 1)[1])
        print(f"{name:40s} {wall_s:7.1f} s  peak RSS {rss_kib / 1024:7.0f} MiB", flush=True)


def main() -> None:
    folder = Path(sys.argv[1])
    megabytes = int(sys.argv[2]) if len(sys.argv) > 2 else 300
    path = folder / "large.pickle"
    start = time.perf_counter()
    entries = write_snapshot(path, megabytes * MiB)
    size_mib = path.stat().st_size / MiB
    print(
        f"wrote {path}: {size_mib:.0f} MiB, {entries} trace entries, "
        f"{time.perf_counter() - start:.0f} s"
    )
    measure(path)


if __name__ == "__main__":
    main()
