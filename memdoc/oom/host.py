"""Host memory failures: SIGKILL/`Killed`, the kernel OOM killer, DataLoader workers, shm."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from memdoc.kinds import OomKind
from memdoc.oom.fields import SIZE, first_group, is_huge, loose, parse_shape, to_bytes, to_int
from memdoc.oom.hostcues import PLATFORM_NOTICES
from memdoc.oom.logtext import Hit, LogText, is_source_line, rank_of, strip_prefix
from memdoc.oom.patterns import Pattern, compile_later
from memdoc.trace.model import OomInfo, ProcessUsage

# Short lines only: a shell's "Killed" line is short, and a 1 MB line must not be rescanned.
_SHORT = 400

_DATALOADER = loose(
    r"DataLoader worker \(pid(?:\(s\))? ([^)]{0,200})\)"
    r" (?:is killed by signal(?:: ([A-Za-z][\w ]{0,40})|\s*$)|exited unexpectedly)"
)
# Signals a worker dies of by its own fault (a bug, a bad library), never for lack of memory.
_NOT_MEMORY_SIGNALS = ("segmentation fault", "aborted", "floating point", "illegal instruction")
_DMESG_NEEDLES = ("kill process", "killed process", "oom-kill:", "oom_reaper", "invoked oom-killer")
_DMESG_KILL = compile_later(
    r"(?:Out of memory|Memory cgroup out of memory|oom-kill)[^\n]{0,80}?:? Kill(?:ed)? process"
    r" (\d{1,10}) \(([^)]{0,100})\)"
)
_KILLED_PROCESS = compile_later(r"Killed process (\d{1,10}) \(([^)]{0,100})\)([^\n]{0,400})")
_RSS = compile_later(r"\b(?:anon|file|shmem)-rss:\s?(\d{1,20})kB")
_OOM_KILL_TASK = compile_later(r"oom-kill:[^\n]{0,300}?\bpid=(\d{1,10})")
_REAPED = compile_later(r"oom_reaper: reaped process (\d{1,10})")
_INVOKED = compile_later(r"(\S{1,100}) invoked oom-killer")
_CGROUP_LIMIT = compile_later(r"memory: usage (\d{1,20})kB, limit (\d{1,20})kB")
_LOCALE_KILLED = ("已杀死", "getötet", "強制終了")
_KILLED_WORDS = r"(?:已杀死|Getötet|強制終了)"
_KILLED_LINE = (
    compile_later(r"^Killed(?::\s?9)?\.?\s*$"),
    # bash's and zsh's job lines: "[1]+  Killed  python train.py", "[1]  1819 killed  python3 ..."
    compile_later(r"^(?:\[\d{1,4}\][+-]?\s+)?(?:(\d{1,10})\s+)?[Kk]illed\s{2,40}\S"),
    compile_later(r"line \d{1,6}:\s{0,4}(\d{1,10}) Killed\b"),
    compile_later(r"^zsh: killed\s"),
    compile_later(r"\]\s?Killed\s*$"),  # after a progress bar that did not end its line
    # The shell's word in other locales (glibc's name of SIGKILL): Chinese, German, Japanese.
    compile_later(
        rf"^(?:\[\d{{1,4}}\][+-]?\s+)?(?:(\d{{1,10}})\s+)?{_KILLED_WORDS}(?:\s{{2,40}}\S|\s*$)"
    ),
    compile_later(rf"[\]\ds]\s?{_KILLED_WORDS}\s*$"),
    compile_later(rf"\d{{1,6}}:\s{{0,4}}(\d{{1,10}}) {_KILLED_WORDS}"),  # a script's line N
)
# "exit code 137", torchrun's "exitcode: -9", DeepSpeed's launcher "exits with return code = -9"
_EXIT_STATUS = (
    r"\b(?:exit(?:ed|s)?|terminated)(?: with)?(?: code| status(?: code)?|code| return code)"
    r"\s{0,3}[:=]?\s{0,3}(?:137|-9)\b"
)
# How a launcher, a shell or a runtime reports an exit by SIGKILL, as (needles, pattern): the
# lowercase needles that anchor a line, the pattern that must hold around them.
_EXIT_KILLS: tuple[tuple[tuple[str, ...], Pattern], ...] = (
    (
        (
            "exit code",
            "status code",
            "exit status",
            "exitcode",
            "exited with code",
            "terminated with code",
            "return code",
        ),
        compile_later(_EXIT_STATUS, re.I),
    ),
    (("exit status",), compile_later(r"non-zero exit status (?:137|-9)\b")),
    (("signals.sigkill",), compile_later(r"<Signals\.SIGKILL: 9>")),
    (("signal 9",), compile_later(r"\bSignal 9 \(SIGKILL\)")),
    (("oomkilled",), compile_later(r"\bOOMKilled\b")),
    # runc's "container init was OOM-killed", a scheduler's "OOM killed"; not "was not ..."
    (
        ("oom-killed", "oom killed"),
        compile_later(r"(?<!not )(?<!n't )(?<!never )\bOOM[- ]killed\b", re.I),
    ),
    (
        ("signal 9", "signal: killed"),
        compile_later(r"\bkilled by signal 9\b|\bsignal: killed\b", re.I),
    ),
    # A compiler killed while building an extension (gcc's cc1plus, nvcc's cicc; the names
    # are hostcues.COMPILERS).
    (
        ("killed signal terminated program", "died due to signal 9"),
        compile_later(r"Killed signal terminated program \w{1,40}|died due to signal 9\b"),
    ),
)
_EXIT_KILL = tuple(pattern for _, pattern in _EXIT_KILLS)
_EXIT_NEEDLES = tuple(dict.fromkeys(needle for needles, _ in _EXIT_KILLS for needle in needles))
# A kill the line itself blames on something other than memory.
OTHER_KILLER = compile_later(
    r"time ?limit|timeout|timed out|cancel|preempt|SIGTERM|SIGINT|Ctrl-C|by (?:the )?user"
    r"|manually|segmentation fault|segfault|watchdog",
    re.I,
)
_PID = compile_later(r"\(pid:? (\d{1,10})\)|by PID (\d{1,10})|process (\d{1,10})", re.I)
_TORCHRUN_RANK = compile_later(r"^rank\s{0,8}:\s{0,4}(\d{1,6})")
_BUS_ERROR = compile_later(r"(?:^|\d\s{1,10}|:\s{0,3})Bus error\b")
# A process ended by SIGBUS as a launcher reports it: DeepSpeed's "exits with return code =
# -7", torchrun's "exitcode: -7", a shell's 135, Python's <Signals.SIGBUS: 7>.
_EXIT_BUS = compile_later(
    _EXIT_STATUS.replace("(?:137|-9)", "(?:135|-7)")
    + r"|non-zero exit status (?:135|-7)\b|<Signals\.SIGBUS: 7>|\bSignal 7 \(SIGBUS\)",
    re.I,
)
_EXIT_BUS_NEEDLES = ("exit code", "exit status", "exitcode", "return code", "sigbus")
_SHM_CUES = ("/dev/shm", "</torch_", "shared memory", "shm")
_NUMPY = loose(
    rf"Unable to allocate ({SIZE}) for an array with shape (\([\d, ]{{0,300}}\))"
    r" and data type (\w+)"
)
_MEMORY_ERROR = compile_later(r"^(?:[\w.]{0,80}\.)?_?(?:Array)?MemoryError\b")
# numpy's own class named in full as an error ("...: Unable to allocate"), anywhere on a line.
_NUMPY_MEMORY_ERROR = compile_later(r"\bnumpy\.core\._exceptions\._ArrayMemoryError:")
_REQUESTED = compile_later(r"(?:allocate|mmap) (\d{1,25}) bytes", re.I)
# macOS malloc prints the size a line or two above "can't allocate region" / bad_alloc.
_MACH_VM_MAP = compile_later(r"mach_vm_map\(size=(\d{1,25})\) failed")
# Torch7's TH (and PyTorch's CPU allocator before 1.0): "Torch: not enough memory: you tried to
# allocate 2GB. Buy new RAM!", the size in whole GiB rounded down (0 means under one).
_TORCH7 = compile_later(r"you tried to allocate (\d{1,10})GB", re.I)


def find(log: LogText) -> list[Hit]:
    """Every host-side memory failure."""
    hits: list[Hit] = []
    for finder in _FINDERS:
        hits.extend(finder(log))
    return hits


def _info(log: LogText, line: int, kind: str, framework: str = "host", **fields: Any) -> OomInfo:
    info = OomInfo(
        framework=framework,
        kind=kind,
        message=strip_prefix(log.head(line, 1000)),
        rank=rank_of(log.head(line, 200)),
    )
    return replace(info, **fields) if fields else info


def _pid_key(pid: int | None) -> tuple[object, ...]:
    return ("pid", pid) if pid is not None else ()


def _dataloader(log: LogText) -> list[Hit]:
    hits = []
    for line, column in log.anchors("dataloader worker"):
        text = log.lines[line][max(0, column - 20) : column + 400]
        match = _DATALOADER.search(text)
        if match is None:
            continue
        pids = tuple(int(p) for p in re.findall(r"\d{1,10}", match.group(1)))
        signal = (match.group(2) or "").strip()
        if signal.lower().startswith(_NOT_MEMORY_SIGNALS):
            continue  # a crash in the worker's own code, not a kill for memory
        kind = OomKind.SHM if signal.lower().startswith("bus error") else OomKind.DATALOADER_KILLED
        processes = tuple(ProcessUsage(pid=pid, used_bytes=None) for pid in pids)
        info = _info(log, line, kind, framework="pytorch", processes=processes)
        hits.append(Hit(line=line, end=line, info=info, rank=info.rank, key=("pids", pids)))
    # "... in worker" (PyTorch), "... in DataLoader worker" (PaddlePaddle)
    for line, column in log.anchors("unexpected bus error encountered in"):
        said = log.lower_head(line, column + 80)[column:]
        framework = "pytorch" if "encountered in worker" in said else "host"
        info = _info(log, line, OomKind.SHM, framework=framework)
        hits.append(Hit(line=line, end=line, info=info, rank=info.rank))
    return hits


def _dmesg(log: LogText) -> list[Hit]:
    hits: list[Hit] = []
    for needle in _DMESG_NEEDLES:
        for line, _ in log.anchors(needle):
            hit = _dmesg_line(log, line)
            if hit is not None:
                hits.append(hit)
    for line, column in log.anchors("failcnt"):
        match = _CGROUP_LIMIT.search(log.lines[line][max(0, column - 200) : column + 50])
        if match is not None:
            info = _info(log, line, OomKind.HOST_KILL, limit_bytes=int(match.group(2)) * 1024)
            hits.append(Hit(line=line, end=line, info=info, role="note", reach=2000))
    return hits


def _dmesg_line(log: LogText, line: int) -> Hit | None:
    text = log.head(line, 1000)
    pid: int | None = None
    used: int | None = None
    match = _KILLED_PROCESS.search(text)
    if match is not None:
        pid = int(match.group(1))
        rss = [int(kb) * 1024 for kb in _RSS.findall(match.group(3))]
        used = sum(rss) if rss else None
    else:
        other = _DMESG_KILL.search(text) or _OOM_KILL_TASK.search(text) or _REAPED.search(text)
        if other is not None:
            pid = int(other.group(1))
        elif _INVOKED.search(text) is not None:
            # The report's first line; the victim's pid comes later, after the task list.
            info = _info(log, line, OomKind.HOST_KILL)
            return Hit(line=line, end=line, info=info, role="prelude", reach=2000, rank=info.rank)
        else:
            return None
    processes = (ProcessUsage(pid=pid, used_bytes=used),)
    info = _info(log, line, OomKind.HOST_KILL, processes=processes)
    return Hit(line=line, end=line, info=info, rank=info.rank, key=_pid_key(pid))


def _killed_lines(log: LogText) -> list[Hit]:
    hits = []
    lines = sorted({line for word in ("killed", *_LOCALE_KILLED) for line, _ in log.anchors(word)})
    for line in lines:
        raw = log.lines[line]
        if len(raw) > _SHORT:
            continue
        text = strip_prefix(raw)
        if "process" in text.lower() or "dataloader" in text.lower():
            continue  # the kernel's and the DataLoader's lines have their own parsers
        for pattern in _KILLED_LINE:
            match = pattern.search(text)
            if match is not None:
                pid = to_int(match.group(1)) if match.groups() else None
                processes = (ProcessUsage(pid=pid, used_bytes=None),) if pid else ()
                info = _info(log, line, OomKind.HOST_KILL, processes=processes)
                hits.append(Hit(line=line, end=line, info=info, rank=info.rank, key=_pid_key(pid)))
                break
    return hits


def _exit_kills(log: LogText) -> list[Hit]:
    """Exit by SIGKILL: `exit code 137`, torchrun's `exitcode: -9`, `<Signals.SIGKILL: 9>`,
    DeepSpeed's `exits with return code = -9`."""
    found: dict[int, int] = {}
    for needle in _EXIT_NEEDLES:
        for line, column in log.anchors(needle):
            found.setdefault(line, column)
    hits = []
    for line, column in sorted(found.items()):
        text = log.lines[line][max(0, column - 200) : column + 200]
        if not any(pattern.search(text) for pattern in _EXIT_KILL) or OTHER_KILLER.search(text):
            continue
        pid_match = _PID.search(text)
        pid = to_int(next((g for g in pid_match.groups() if g), None)) if pid_match else None
        rank = rank_of(log.head(line, 200))
        for back in range(1, 4):
            rank_match = _TORCHRUN_RANK.match(strip_prefix(log.head(line - back, 200)))
            if rank is None and rank_match is not None:
                rank = int(rank_match.group(1))
        processes = (ProcessUsage(pid=pid, used_bytes=None),) if pid else ()
        info = _info(log, line, OomKind.HOST_KILL, processes=processes)
        if rank is not None:
            info = replace(info, rank=rank)
        hits.append(Hit(line=line, end=line, info=info, rank=rank, key=_pid_key(pid)))
    return hits


def _shm(log: LogText) -> list[Hit]:
    hits = []
    for line, column in log.anchors("bus error"):
        text = strip_prefix(log.lines[line][max(0, column - 200) : column + 200])
        if "dataloader" in text.lower() or _BUS_ERROR.search(text) is None:
            continue
        info = _info(log, line, OomKind.SHM)
        hits.append(Hit(line=line, end=line, info=info, rank=info.rank))
    for needle in _EXIT_BUS_NEEDLES:
        for line, column in log.anchors(needle):
            text = log.lines[line][max(0, column - 100) : column + 100]
            if _EXIT_BUS.search(text) is not None:
                info = _info(log, line, OomKind.SHM)
                hits.append(Hit(line=line, end=line, info=info, rank=info.rank, key=("sigbus",)))
    for line, column in log.anchors("no space left on device"):
        lowered = log.lower[log.starts[line] : log.starts[line] + column + 200][-600:]
        if not any(cue in lowered for cue in _SHM_CUES):
            continue
        framework = "pytorch" if "torch" in lowered else "host"
        info = _info(log, line, OomKind.SHM, framework=framework)
        hits.append(Hit(line=line, end=line, info=info, rank=info.rank))
    return hits


def _host_alloc(log: LogText) -> list[Hit]:
    """Host allocation failures: MemoryError (numpy), std::bad_alloc, ENOMEM, OpenCV, JVM."""
    hits = []
    for line, column in log.anchors("memoryerror"):
        text = strip_prefix(log.lines[line][max(0, column - 100) : column + 600])
        if _MEMORY_ERROR.match(text) is None and _NUMPY_MEMORY_ERROR.search(text) is None:
            continue
        if "device memory" in text.lower():
            continue  # Theano's MemoryError for the GPU: a device error, read as one elsewhere
        numpy = _NUMPY.search(text)
        fields: dict[str, Any] = {"device_type": "cpu"}
        if numpy is not None:
            requested = to_bytes(numpy.group(1))
            fields.update(
                requested_bytes=requested,
                requested_unknown_huge=is_huge(requested),
                shape=parse_shape(numpy.group(2).replace("(", "[").replace(")", "]")),
                dtype=numpy.group(3),
            )
        info = _info(log, line, OomKind.HOST_ALLOC, **fields)
        hits.append(Hit(line=line, end=line, info=info, rank=info.rank))
    for needle in (
        "std::bad_alloc",
        "cannot allocate memory",
        "insufficient memory",
        "java.lang.outofmemoryerror",
        "torch: not enough memory",
        "can't allocate region",  # macOS malloc
    ):
        for line, column in log.anchors(needle):
            text = log.lines[line][max(0, column - 300) : column + 300]
            above = " ".join(log.head(back, 300) for back in range(max(0, line - 3), line + 1))
            requested = _requested(text) or to_int(first_group(_MACH_VM_MAP.search(above)))
            info = _info(
                log,
                line,
                OomKind.HOST_ALLOC,
                device_type="cpu",
                requested_bytes=requested,
                requested_unknown_huge=is_huge(requested),
            )
            hits.append(Hit(line=line, end=line, info=info, rank=info.rank))
    return hits


def _requested(text: str) -> int | None:
    requested = to_int(first_group(_REQUESTED.search(text)))
    if requested is not None:
        return requested
    gib = to_int(first_group(_TORCH7.search(text)))
    return gib * 2**30 if gib else None


# "has not exceeded memory limit", "didn't use an instance type with more memory"
_NEGATED = compile_later(r"(?:\bnot|\bnever|\bno|n't)\s+(?:\w+\s+){0,2}$", re.I)
_SLURM_LIMIT = compile_later(r"exceeded memory limit \((\d{1,20}) > (\d{1,20})\)")
_OLLAMA = loose(rf"requires more system memory \(({SIZE})\) than is available \(({SIZE})\)")


def _platform_notice(log: LogText) -> list[Hit]:
    hits = []
    for needle, kind in PLATFORM_NOTICES:
        for line, column in log.anchors(needle):
            text = log.lines[line][max(0, column - 200) : column + 300]
            before = log.lines[line][max(0, column - 40) : column]
            if is_source_line(strip_prefix(text)) or _NEGATED.search(before):
                continue
            info = _info(log, line, kind, **_platform_figures(text))
            hits.append(Hit(line=line, end=line, info=info, rank=info.rank))
    return hits


def _platform_figures(text: str) -> dict[str, Any]:
    """What a notice says of sizes: SLURM's usage and limit (KiB), Ollama's need and room."""
    slurm = _SLURM_LIMIT.search(text)
    if slurm is not None:
        return {"limit_bytes": int(slurm.group(2)) * 1024}
    ollama = _OLLAMA.search(text)
    if ollama is not None:
        requested = to_bytes(ollama.group(1))
        return {
            "requested_bytes": requested,
            "free_bytes": to_bytes(ollama.group(2)),
            "device_type": "cpu",
            "phase": "load",
        }
    return {}


_FINDERS: tuple[Callable[[LogText], list[Hit]], ...] = (
    _dataloader,
    _platform_notice,
    _dmesg,
    _killed_lines,
    _exit_kills,
    _shm,
    _host_alloc,
)
