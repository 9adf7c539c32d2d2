"""A trace's events kept as columns: a million steps cost a few arrays, not a million dicts."""

from __future__ import annotations

import json
import struct
from array import array
from collections.abc import Iterable, Iterator, Mapping, Sequence
from itertools import compress
from typing import Any, overload

from memdoc.trace.model import Event

# Flat data (scalar values under string keys, the usual case) is held as one int64 slot per
# value in a shared pool; its keys and value types, the shape, are held once per shape.
_INT, _FLOAT, _STR, _BOOL, _NONE = range(5)
_CODES: dict[type, int] = {int: _INT, float: _FLOAT, str: _STR, bool: _BOOL, type(None): _NONE}
_NO_PID = -(2**31)  # the pid column is 32 bits wide: this value says "no pid"
# Bounds on the tables that make columns cheap; past them an event is kept as a whole, so a
# file of a million kinds, shapes or strings costs what its events cost, no more.
MAX_KINDS = 250
MAX_SHAPES = 250
MAX_STRINGS = 10_000
MAX_SIGNATURES = 1_000  # keys and value types seen, flat or not
# Rows the columns cannot hold, kept in `_objects`: their data (the line it was read from, or
# the mapping given), or the whole event (a pid the column cannot hold, a kind past the
# table). `_OTHER_KIND` is the kind column of an event whose kind is past the table.
_DATA = 254
_WHOLE = 255
_OTHER_KIND = 255
_FLOAT_BITS = struct.Struct("<d")
_INT_BITS = struct.Struct("<q")

_Signature = tuple[tuple[str, ...], tuple[type, ...]]


class _Shape:
    """The keys of flat data and the code of each value; value i is in the row's slot i."""

    def __init__(self, keys: tuple[str, ...], codes: tuple[int, ...]) -> None:
        self.keys = keys
        self.codes = codes
        self.pairs = tuple(zip(keys, codes, strict=True))
        self.slot_of = {key: i for i, key in enumerate(keys)}
        # What is not an int (or a bool, which is one) has to be turned into one.
        self.strings = tuple(i for i, code in enumerate(codes) if code == _STR)
        self.others = tuple(i for i, code in enumerate(codes) if code in (_FLOAT, _NONE))


class EventLog:
    """Events in the order they were added, each one row of typed columns.

    An event is made again when asked for: equal to the one added, not the same object.
    """

    def __init__(self) -> None:
        self._t = array("d")
        self._pid = array("i")
        self._kind = array("B")
        self._shape = array("B")
        self._start = array("q")  # where the row's values begin in `_pool`
        self._pool = array("q")
        self._rows: dict[int, array[int]] = {}  # kind id -> its rows, in order
        self._kinds: list[str] = []
        self._kind_ids: dict[str, int] = {}
        self._shapes: list[_Shape] = []
        self._shape_ids: dict[_Signature, int | None] = {}  # None: not flat
        self._strings: list[str] = []
        self._string_ids: dict[str, int] = {}
        self._objects: list[Any] = []

    def __len__(self) -> int:
        return len(self._t)

    def copy(self) -> EventLog:
        """A copy that later additions to this log do not change."""
        twin = EventLog()
        for column in ("_t", "_pid", "_kind", "_shape", "_start", "_pool"):
            getattr(twin, column).extend(getattr(self, column))
        twin._rows = {kind: array("q", rows) for kind, rows in self._rows.items()}
        twin._kinds, twin._kind_ids = list(self._kinds), dict(self._kind_ids)
        twin._shapes, twin._shape_ids = list(self._shapes), dict(self._shape_ids)
        twin._strings, twin._string_ids = list(self._strings), dict(self._string_ids)
        twin._objects = list(self._objects)  # events and their data are never changed
        return twin

    def add(self, event: Event) -> None:
        self.append(event.t, event.kind, event.pid, event.data)

    def append(
        self,
        t: float,
        kind: str,
        pid: int | None,
        data: Mapping[str, Any],
        *,
        line: bytes | None = None,
    ) -> None:
        """Keep the event of these fields. `line` is the trace line they were read from: when
        the data does not fit the columns, the line is kept instead, and read again when the
        event is asked for (a line costs its length; a dict of dicts, ten times that)."""
        kind_id = self._kind_ids.get(kind)
        if kind_id is None:
            kind_id = self._new_kind(kind)
        if kind_id is None or (pid is not None and not _fits_pid(pid)):
            whole = [self._object(Event(t, kind, pid, data))]
            self._add_row(t, None, _OTHER_KIND if kind_id is None else kind_id, _WHOLE, whole)
            return
        shape = None
        if type(data) is dict:
            values = list(data.values())
            shape = self._shape_id(tuple(data), values)
        if shape is None or not self._as_slots(self._shapes[shape], values):
            shape, values = _DATA, [self._object(data if line is None else line)]
        try:
            self._add_row(t, pid, kind_id, shape, values)
        except OverflowError:  # an int past 64 bits
            self._add_row(t, pid, kind_id, _DATA, [self._object(data if line is None else line)])

    def _add_row(self, t: float, pid: int | None, kind: int, shape: int, values: list[Any]) -> None:
        """Add a row; nothing when a value overflows its slot (OverflowError)."""
        start = len(self._pool)
        try:
            self._pool.extend(values)
        except OverflowError:
            del self._pool[start:]
            raise
        row = len(self._t)
        self._t.append(t)
        self._pid.append(_NO_PID if pid is None else pid)
        self._kind.append(kind)
        self._shape.append(shape)
        self._start.append(start)
        rows = self._rows.get(kind)
        if rows is None:
            rows = self._rows[kind] = array("q")
        rows.append(row)

    def event(self, row: int) -> Event:
        """The event of one row."""
        shape = self._shape[row]
        start = self._start[row]
        if shape == _WHOLE:
            whole: Event = self._objects[self._pool[start]]
            return whole
        pid = self._pid[row]
        if shape == _DATA:
            kept = self._objects[self._pool[start]]
            data = json.loads(kept)["data"] if isinstance(kept, bytes) else kept
        else:
            data = self._data(self._shapes[shape], start)
        return Event(self._t[row], self._kinds[self._kind[row]], _pid_or_none(pid), data)

    # -- questions on some rows, answered from the columns ------------------------------------

    def times(self, rows: Sequence[int]) -> array[float]:
        return array("d", map(self._t.__getitem__, rows))

    def values(self, rows: Sequence[int], key: str) -> list[Any]:
        """`data.get(key)` of each row."""
        out: list[Any] = []
        slots = [s.slot_of.get(key) for s in self._shapes]  # where each shape holds `key`
        shapes, starts, pool = self._shape, self._start, self._pool
        for row in rows:
            shape = shapes[row]
            if shape >= _DATA:
                out.append(self.event(row).data.get(key))
            elif (slot := slots[shape]) is None:
                out.append(None)
            else:
                out.append(self._value(self._shapes[shape].codes[slot], pool[starts[row] + slot]))
        return out

    def pids(self, rows: Sequence[int]) -> set[int | None]:
        """The pids the rows name."""
        if self._has_whole(rows):
            return {self.event(row).pid for row in rows}
        return {_pid_or_none(pid) for pid in set(map(self._pid.__getitem__, rows))}

    def with_pid(self, rows: Sequence[int], pid: int | None) -> array[int]:
        """The rows of process `pid`."""
        if self._has_whole(rows):
            return array("q", (row for row in rows if self.event(row).pid == pid))
        column = _NO_PID if pid is None else pid
        return array("q", compress(rows, map(column.__eq__, map(self._pid.__getitem__, rows))))

    def _has_whole(self, rows: Sequence[int]) -> bool:
        return bool(rows) and max(map(self._shape.__getitem__, rows)) == _WHOLE

    def view(self, kind: str | None = None) -> EventView:
        """Every event, or every event of one kind, in the order they were added."""
        if kind is None:
            return EventView(self, range(len(self)))
        kind_id = self._kind_ids.get(kind)
        if kind_id is not None:
            return EventView(self, self._rows[kind_id])
        others = self._rows.get(_OTHER_KIND, array("q"))
        return EventView(self, array("q", (r for r in others if self.event(r).kind == kind)))

    # -- columns ----------------------------------------------------------------------------

    def _new_kind(self, kind: object) -> int | None:
        if type(kind) is not str or len(self._kinds) >= MAX_KINDS:
            return None
        self._kind_ids[kind] = len(self._kinds)
        self._kinds.append(kind)
        return self._kind_ids[kind]

    def _object(self, value: Any) -> int:
        self._objects.append(value)
        return len(self._objects) - 1

    def _shape_id(self, keys: tuple[str, ...], values: list[Any]) -> int | None:
        """The id of the shape of data of these keys and values; None when it is not flat or
        the table is full."""
        signature = (keys, tuple(map(type, values)))
        found = self._shape_ids.get(signature, -1)
        if found != -1:
            return found
        types = signature[1]
        found = None
        flat = all(type(k) is str for k in keys) and all(t in _CODES for t in types)
        if flat and len(self._shapes) < MAX_SHAPES:
            found = len(self._shapes)
            self._shapes.append(_Shape(keys, tuple(_CODES[t] for t in types)))
        if len(self._shape_ids) < MAX_SIGNATURES:  # not flat, too: asked once
            self._shape_ids[signature] = found
        return found

    def _as_slots(self, shape: _Shape, values: list[Any]) -> bool:
        """Turn the values of flat data into their slots, in place; False when the string
        table is full. Ints and bools are their own slots (an int past 64 bits is found
        when the slots are added to the pool)."""
        for i in shape.strings:
            found = self._string_ids.get(values[i])
            if found is None:
                if len(self._strings) >= MAX_STRINGS:
                    return False
                found = self._string_ids[values[i]] = len(self._strings)
                self._strings.append(values[i])
            values[i] = found
        for i in shape.others:
            value = values[i]
            values[i] = 0 if value is None else _INT_BITS.unpack(_FLOAT_BITS.pack(value))[0]
        return True

    def _data(self, shape: _Shape, start: int) -> dict[str, Any]:
        pool, strings = self._pool, self._strings
        data: dict[str, Any] = {}
        for slot, (key, code) in enumerate(shape.pairs, start):
            if code == _INT:  # the usual codes first, without a call
                data[key] = pool[slot]
            elif code == _STR:
                data[key] = strings[pool[slot]]
            else:
                data[key] = self._value(code, pool[slot])
        return data

    def _value(self, code: int, slot: int) -> Any:
        """The value that `slot` holds as `code` says."""
        if code == _INT:
            return slot
        if code == _STR:
            return self._strings[slot]
        if code == _FLOAT:
            return _FLOAT_BITS.unpack(_INT_BITS.pack(slot))[0]
        return None if code == _NONE else slot == 1  # a bool


def _pid_or_none(pid: int) -> int | None:
    return None if pid == _NO_PID else pid


def _fits_pid(pid: object) -> bool:
    return type(pid) is int and _NO_PID < pid < 2**31


class EventView(Sequence[Event]):
    """Some events of a log, in order, made one by one as they are read. It sees the events
    that were in the log when it was made, not those added later."""

    def __init__(self, log: EventLog, rows: Sequence[int]) -> None:
        self._log = log
        self._rows = rows
        self._len = len(rows)

    def __len__(self) -> int:
        return self._len

    @overload
    def __getitem__(self, index: int) -> Event: ...

    @overload
    def __getitem__(self, index: slice) -> EventView: ...

    def __getitem__(self, index: int | slice) -> Event | EventView:
        if isinstance(index, slice):
            return EventView(self._log, self._own_rows()[index])
        position = index + self._len if index < 0 else index
        if not 0 <= position < self._len:
            raise IndexError("event index out of range")
        return self._log.event(self._rows[position])

    def __iter__(self) -> Iterator[Event]:
        event = self._log.event
        rows = self._rows
        for i in range(self._len):
            yield event(rows[i])

    def __repr__(self) -> str:
        return f"<EventView of {self._len} events>"

    # Questions answered from the columns, without making the events.

    def times(self) -> array[float]:
        """Each event's `t`, in order."""
        return self._log.times(self._own_rows())

    def values(self, key: str) -> list[Any]:
        """Each event's `data.get(key)`, in order."""
        return self._log.values(self._own_rows(), key)

    def pids(self) -> set[int | None]:
        """The pids the events name."""
        return self._log.pids(self._own_rows())

    def with_pid(self, pid: int | None) -> EventView:
        """The events of process `pid`."""
        return EventView(self._log, self._log.with_pid(self._own_rows(), pid))

    def where(self, keep: Iterable[bool]) -> EventView:
        """The events for which `keep` (one flag per event, in order) is true."""
        return EventView(self._log, array("q", compress(self._own_rows(), keep)))

    def _own_rows(self) -> Sequence[int]:
        return self._rows if len(self._rows) == self._len else self._rows[: self._len]
