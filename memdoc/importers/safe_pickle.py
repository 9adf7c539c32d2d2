"""Load pickles of plain data without ever running code: opcodes are vetted before unpickling."""

from __future__ import annotations

import mmap
import os
import pickle
import resource
from pathlib import Path
from typing import Any, BinaryIO

import psutil

from memdoc.errors import InputError
from memdoc.files import require_regular_file
from memdoc.units import GiB, format_bytes

# Larger snapshot files exist only as damage or attack; refusing them early keeps memory bounded.
MAX_PICKLE_BYTES = 8 * GiB
# Measured: loading a 390 MiB snapshot peaked at 4.4 times its size (1.7 GiB RSS).
MEMORY_PER_FILE_BYTE = 5

_PROTO = 0x80
_STOP = ord(".")
# Opcodes that only build plain data, by the size of their fixed argument (opcode included).
_FIXED_STEP = [0] * 256
for _op in b"()012N\x88\x89]}aesutld\x85\x86\x87\x94\x8f\x90\x91":
    _FIXED_STEP[_op] = 1
for _op in b"Khq\x80":
    _FIXED_STEP[_op] = 2
_FIXED_STEP[ord("M")] = 3
for _op in b"Jj":
    _FIXED_STEP[_op] = 5
for _op in b"G\x95":
    _FIXED_STEP[_op] = 9
# Length-prefixed strings, bytes and longs: opcode -> size of the little-endian length.
_PREFIXED = {0x8C: 1, ord("X"): 4, 0x8D: 8, ord("C"): 1, ord("B"): 4, 0x8E: 8, 0x96: 8}
_PREFIXED.update({0x8A: 1, 0x8B: 4, ord("U"): 1, ord("T"): 4})
# Protocol 0 opcodes whose argument runs to the end of the line.
_LINE_OPS = frozenset(b"ILFSVg")
# What each opcode will cost in memory once unpickled, in bytes (CPython 3, 64-bit), on top
# of the length of a string's or a number's argument. Every value pushed takes a slot in the
# container it goes into (with the container's spare room); memo entries take one each. A
# file is small next to what it builds: 20 MB of empty dicts is 10 million dicts, 0.8 GiB.
_SLOT_BYTES = 16
_COST_BYTES = [0] * 256
for _op in b"NKhjg2\x88\x89":  # None, bools, cached small ints, memo gets, DUP: a slot
    _COST_BYTES[_op] = _SLOT_BYTES
for _op in b"JMILGF\x8a\x8b":  # ints and floats: an object each
    _COST_BYTES[_op] = _SLOT_BYTES + 32
for _op in b"}d":  # dicts
    _COST_BYTES[_op] = _SLOT_BYTES + 64
for _op in b"]l\x85\x86\x87t":  # lists and tuples (their items pay their own slots)
    _COST_BYTES[_op] = _SLOT_BYTES + 64
for _op in b"\x8f\x91":  # sets
    _COST_BYTES[_op] = _SLOT_BYTES + 216
for _op in b"\x8cX\x8dSVUT":  # strings: a header, and at most a byte per byte
    _COST_BYTES[_op] = _SLOT_BYTES + 80
for _op in b"CB\x8e\x96":  # bytes and bytearrays
    _COST_BYTES[_op] = _SLOT_BYTES + 40
for _op in b"\x94qrp":  # memo entries
    _COST_BYTES[_op] = _SLOT_BYTES
_LONG_BINPUT = ord("r")
_PUT = ord("p")
# Opcodes that import, call or look up objects: the way a pickle runs code.
_CODE_OPCODES = {
    ord("c"): "GLOBAL (imports a Python object)",
    0x93: "STACK_GLOBAL (imports a Python object)",
    ord("i"): "INST (imports a class and calls it)",
    ord("o"): "OBJ (calls a class)",
    ord("R"): "REDUCE (calls a function)",
    ord("b"): "BUILD (sets object state)",
    0x81: "NEWOBJ (calls a class)",
    0x92: "NEWOBJ_EX (calls a class)",
    0x82: "EXT1 (imports a registered object)",
    0x83: "EXT2 (imports a registered object)",
    0x84: "EXT4 (imports a registered object)",
    ord("P"): "PERSID (asks for an external object)",
    ord("Q"): "BINPERSID (asks for an external object)",
    0x97: "NEXT_BUFFER (asks for an external buffer)",
    0x98: "READONLY_BUFFER (asks for an external buffer)",
}


class RefusedPickle(InputError):
    """A pickle memdoc will not load: it would run code, or it is damaged or absurdly large."""


def load_plain_pickle(path: str | os.PathLike[str]) -> Any:
    """Load a pickle that holds only dicts, lists, tuples, strings, numbers, bools and None.

    Every opcode is checked first (nothing is unpickled before that), so a pickle that would
    import or call anything is refused and nothing of it runs.

    Raises:
        RefusedPickle: the file would run code, is truncated or corrupt, or is too large.
        InputError: the file cannot be read.
    """
    path = Path(path)
    _check_name(path)
    require_regular_file(path)  # a FIFO would block the open itself
    try:
        with open(path, "rb") as stream:
            size = os.fstat(stream.fileno()).st_size
            _check_size(path, size)
            _vet(path, stream)
            stream.seek(0)
            return _unpickle(path, stream)
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise InputError(f"{path}: is a folder") from None
    except PermissionError:
        raise InputError(f"{path}: cannot read it (permission denied)") from None
    except OSError as exc:  # a pipe or a device cannot be mapped; a disk can fail
        raise InputError(f"{path}: cannot read it ({exc.strerror or exc})") from None


def _check_name(path: Path) -> None:
    """A name from a damaged or hostile trace may be one no file can have (a NUL, a lone
    surrogate): that is a missing file, not an error of memdoc's."""
    try:
        name = os.fsencode(path)
    except UnicodeEncodeError:
        name = b"\0"
    if b"\0" in name:
        raise InputError(f"{path}: no such file (no file can have this name)")


def memory_needed_bytes(file_bytes: int) -> int:
    """About how much memory loading a snapshot of this size takes."""
    return file_bytes * MEMORY_PER_FILE_BYTE


def _check_size(path: Path, size: int) -> None:
    if size == 0:
        raise RefusedPickle(f"{path}: empty file, not a pickle")
    if size > MAX_PICKLE_BYTES:
        raise RefusedPickle(
            f"{path}: {format_bytes(size)} is larger than any memory snapshot memdoc reads "
            f"({format_bytes(MAX_PICKLE_BYTES)})",
            hint="record fewer entries: torch.cuda.memory._record_memory_history(max_entries=...)",
        )
    needed = memory_needed_bytes(size)
    available = psutil.virtual_memory().available
    if needed > available:
        raise RefusedPickle(
            f"{path}: loading it needs about {format_bytes(needed)} of memory, "
            f"{format_bytes(available)} is available",
            hint="analyse it on a machine with more memory",
        )


def memory_budget_bytes() -> int:
    """The memory a load may take: what is available, and no more than the address space
    left under this process's limit (`ulimit -v`)."""
    budget = int(psutil.virtual_memory().available)
    limit, _ = resource.getrlimit(resource.RLIMIT_AS)
    if limit != resource.RLIM_INFINITY:
        budget = min(budget, limit - int(psutil.Process().memory_info().vms))
    return max(budget, 0)


def _vet(path: Path, stream: BinaryIO) -> None:
    with mmap.mmap(stream.fileno(), 0, access=mmap.ACCESS_READ) as data:
        if data[0] != _PROTO or not 2 <= data[1] <= 5:
            raise RefusedPickle(f"{path}: not a pickle (no pickle protocol 2-5 header)")
        try:
            cost_bytes = _scan(path, data)
        except IndexError:
            raise RefusedPickle(f"{path}: truncated pickle (it ends before its STOP)") from None
    budget = memory_budget_bytes()
    if cost_bytes > budget:
        raise RefusedPickle(
            f"{path}: refused: its objects would take about {format_bytes(cost_bytes)} of "
            f"memory, {format_bytes(budget)} is available; nothing was loaded",
            hint="analyse it on a machine with more memory",
        )


def _scan(path: Path, data: mmap.mmap) -> int:
    """Walk every opcode; return what the objects will cost in memory, in bytes, once built.
    Kept flat: it runs once per byte."""
    step = _FIXED_STEP
    prefixed = _PREFIXED
    costs = _COST_BYTES
    from_bytes = int.from_bytes
    pos = 0
    cost = 0
    while True:
        op = data[pos]
        cost += costs[op]
        skip = step[op]
        if skip:
            pos += skip
            continue
        if op == _STOP:
            return cost
        width = prefixed.get(op)
        if width is not None:
            length = from_bytes(data[pos + 1 : pos + 1 + width], "little")
            cost += length
            pos += 1 + width + length
            if pos > len(data):
                raise IndexError(pos)
        elif op == _LONG_BINPUT:
            _check_memo_index(path, from_bytes(data[pos + 1 : pos + 5], "little"), pos)
            pos += 5
        elif op in _LINE_OPS or op == _PUT:
            end = data.find(b"\n", pos)
            if end < 0:
                raise IndexError(pos)
            if op == _PUT:
                _check_memo_index(path, _int_or(data[pos + 1 : end], pos + 1), pos)
            cost += end - pos
            pos = end + 1
        else:
            raise _refusal(path, op, pos)


def _check_memo_index(path: Path, index: int, pos: int) -> None:
    # The C unpickler sizes its memo table by the largest index it sees: an index beyond
    # the number of opcodes read so far can only serve to exhaust memory.
    if index > pos:
        raise RefusedPickle(
            f"{path}: refused: memo index {index} at byte {pos} is larger than the pickle "
            "could ever fill (a memory bomb); nothing was loaded"
        )


def _int_or(text: bytes, default: int) -> int:
    try:
        return int(text)
    except ValueError:
        return default


def _refusal(path: Path, op: int, pos: int) -> RefusedPickle:
    what = _CODE_OPCODES.get(op)
    if what is not None:
        return RefusedPickle(
            f"{path}: refused: opcode {what} at byte {pos}; memory snapshots hold only "
            "plain data, so this pickle could run code and was not loaded"
        )
    return RefusedPickle(f"{path}: damaged pickle (unknown opcode 0x{op:02x} at byte {pos})")


class _PlainUnpickler(pickle.Unpickler):
    """Second line of defence: the vetting already refused every opcode that gets here."""

    def find_class(self, module: str, name: str) -> Any:
        raise RefusedPickle(f"refused: the pickle asks for {module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        raise RefusedPickle("refused: the pickle asks for an external object")


def _unpickle(path: Path, stream: BinaryIO) -> Any:
    try:
        return _PlainUnpickler(stream).load()
    except RefusedPickle as exc:
        raise RefusedPickle(f"{path}: {exc.message}") from None
    except MemoryError:
        raise RefusedPickle(f"{path}: not enough memory to load this pickle") from None
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError, KeyError) as exc:
        raise RefusedPickle(f"{path}: damaged pickle ({exc})") from None
