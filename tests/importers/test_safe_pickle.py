"""Snapshot pickles are loaded without running anything: hostile ones are refused in one line."""

from __future__ import annotations

import builtins
import os
import pickle
import random
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from memdoc.importers import safe_pickle
from memdoc.importers.safe_pickle import RefusedPickle, load_plain_pickle
from tests.importers.snapshot_dicts import OOM_SNAPSHOT


class _Runs:
    """Pickles to whatever call `reduce` describes: what an attacker would ship."""

    def __init__(self, reduce: tuple[Any, ...]) -> None:
        self.reduce = reduce

    def __reduce__(self) -> tuple[Any, ...]:
        return self.reduce


def _hostile(marker: Path) -> dict[str, bytes]:
    touch = f"touch {marker}"
    return {
        "os.system via __reduce__": pickle.dumps(_Runs((os.system, (touch,))), protocol=4),
        "builtins.eval": pickle.dumps(
            _Runs((builtins.eval, (f"__import__('os').system({touch!r})",))), protocol=2
        ),
        "subprocess.Popen": pickle.dumps(
            _Runs((subprocess.Popen, (["touch", str(marker)],))), protocol=5
        ),
        "snapshot dict hiding a call": pickle.dumps(
            {"segments": [], "device_traces": [[_Runs((os.system, (touch,)))]]}, protocol=4
        ),
        "GLOBAL opcode": b"\x80\x02cos\nsystem\n(X" + _str(touch) + b"tR.",
        "STACK_GLOBAL opcode": b"\x80\x04X\x02\x00\x00\x00osX\x06\x00\x00\x00system\x93.",
        "INST opcode": b"\x80\x02(X" + _str(touch) + b"ios\nsystem\n.",
        "OBJ opcode": b"\x80\x02(N)o.",
        "REDUCE opcode": b"\x80\x02N)R.",
        "BUILD opcode": b"\x80\x02}}b.",
        "persistent id": b"\x80\x02X\x01\x00\x00\x00xQ.",
        "extension registry": b"\x80\x02\x82\x01.",
    }


def _str(text: str) -> bytes:
    data = text.encode()
    return len(data).to_bytes(4, "little") + data


@pytest.mark.parametrize(
    "name",
    [
        "os.system via __reduce__",
        "builtins.eval",
        "subprocess.Popen",
        "snapshot dict hiding a call",
        "GLOBAL opcode",
        "STACK_GLOBAL opcode",
        "INST opcode",
        "OBJ opcode",
        "REDUCE opcode",
        "BUILD opcode",
        "persistent id",
        "extension registry",
    ],
)
def test_a_pickle_that_would_run_code_is_refused_and_nothing_runs(
    tmp_path: Path, name: str
) -> None:
    marker = tmp_path / "ran"
    path = tmp_path / "snapshot.pickle"
    path.write_bytes(_hostile(marker)[name])
    # The plain unpickler really would run it: the test pickles are not toothless.
    if name in ("os.system via __reduce__", "GLOBAL opcode"):
        pickle.loads(path.read_bytes())
        assert marker.exists()
        marker.unlink()

    with pytest.raises(RefusedPickle) as refused:
        load_plain_pickle(path)

    assert "\n" not in refused.value.message
    assert "refused" in refused.value.message or "damaged" in refused.value.message
    assert not marker.exists()


def test_the_refusal_names_the_opcode_and_where_it_is(tmp_path: Path) -> None:
    path = tmp_path / "s.pickle"
    path.write_bytes(b"\x80\x02cos\nsystem\n.")
    with pytest.raises(RefusedPickle, match=r"GLOBAL \(imports a Python object\) at byte 2"):
        load_plain_pickle(path)


def test_a_memo_bomb_is_refused_before_it_allocates(tmp_path: Path) -> None:
    # 11 bytes that make Python's own C unpickler fill a 16 GiB memo table.
    path = tmp_path / "bomb.pickle"
    path.write_bytes(b"\x80\x04Nr\xff\xff\xff\x3f.")
    with pytest.raises(RefusedPickle, match="memory bomb"):
        load_plain_pickle(path)


def test_deeply_nested_lists_load_without_recursion_and_stay_data(tmp_path: Path) -> None:
    depth = 200_000
    path = tmp_path / "nested.pickle"
    path.write_bytes(b"\x80\x04" + b"]" * depth + b"a" * (depth - 1) + b".")
    data = load_plain_pickle(path)
    assert isinstance(data, list)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        pytest.param(b"", "empty file", id="empty"),
        pytest.param(random.Random(7).randbytes(4096), "not a pickle", id="random-bytes"),
        pytest.param(b"\x80\x04]\x94(K\x01K\x02", "truncated", id="truncated"),
        pytest.param(b"(lp0\nI1\na.", "not a pickle", id="protocol-0"),
        pytest.param(b"\x80\x04\xff.", "unknown opcode 0xff", id="unknown-opcode"),
    ],
)
def test_damaged_files_are_refused_in_one_line(
    tmp_path: Path, content: bytes, message: str
) -> None:
    path = tmp_path / "x.pickle"
    path.write_bytes(content)
    with pytest.raises(RefusedPickle, match=message):
        load_plain_pickle(path)


def test_a_real_snapshot_cut_in_half_is_refused_as_truncated(tmp_path: Path) -> None:
    data = OOM_SNAPSHOT.read_bytes()
    path = tmp_path / "cut.pickle"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(RefusedPickle, match="truncated"):
        load_plain_pickle(path)


def test_real_snapshots_load_as_plain_data() -> None:
    data = load_plain_pickle(OOM_SNAPSHOT)
    assert set(data) == {"segments", "device_traces"}
    assert len(data["segments"]) == 176


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_plain_data_of_every_kind_round_trips(tmp_path: Path, protocol: int) -> None:
    value: dict[str, Any] = {
        "segment_pool_id": (0, 0),
        "floats": [0.5, -1e300],
        "big": 2**70,
        "flags": [True, False, None],
        "text": "ü" * 300,
    }
    if protocol >= 4:  # older protocols spell bytes and sets as calls, which are refused
        value.update({"bytes": b"\x00\x01", "set": {1, 2}, "frozen": frozenset({3})})
    path = tmp_path / "p.pickle"
    path.write_bytes(pickle.dumps([value, value], protocol=protocol))
    assert load_plain_pickle(path) == [value, value]


def test_the_memo_bomb_would_really_exhaust_memory_without_the_check(tmp_path: Path) -> None:
    # Run Python's unpickler on it under a 1 GiB address-space cap: it must fail for memory.
    path = tmp_path / "bomb.pickle"
    path.write_bytes(b"\x80\x04Nr\xff\xff\xff\x3f.")
    code = (
        "import pickle, sys\n"
        "try:\n    pickle.loads(open(sys.argv[1], 'rb').read())\n"
        "except MemoryError:\n    print('MemoryError')\n"
    )

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))

    done = subprocess.run(
        [sys.executable, "-c", code, str(path)], capture_output=True, preexec_fn=cap, timeout=60
    )
    assert b"MemoryError" in done.stdout


def test_a_file_larger_than_any_snapshot_is_refused_before_reading(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(safe_pickle, "MAX_PICKLE_BYTES", 100_000)
    with pytest.raises(RefusedPickle, match="larger than any memory snapshot") as refused:
        load_plain_pickle(OOM_SNAPSHOT)
    assert "max_entries" in (refused.value.hint or "")


def test_a_file_that_would_not_fit_in_memory_is_refused_before_reading(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(safe_pickle, "MEMORY_PER_FILE_BYTE", 10**9)  # as if 100 TB were needed
    with pytest.raises(RefusedPickle, match="of memory, .* is available"):
        load_plain_pickle(OOM_SNAPSHOT)
