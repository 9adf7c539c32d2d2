"""`memdoc info`: one screen of what memdoc can see here, to paste into a bug report."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from memdoc.printable import printable
from memdoc.units import format_bytes
from memdoc.version import __version__

NAME = "info"
HELP = "show what memdoc can see on this machine (driver, GPUs, frameworks, limits)"

# Read from package metadata: importing a framework to ask its version could grab a GPU.
_PACKAGES = (
    ("PyTorch", ("torch",)),
    ("TensorFlow", ("tensorflow", "tensorflow-cpu", "tf-nightly")),
    ("JAX", ("jax",)),
    ("jaxlib", ("jaxlib",)),
    ("CuPy", ("cupy", "cupy-cuda12x", "cupy-cuda11x")),
    ("nvidia-ml-py", ("nvidia-ml-py",)),
    ("textual", ("textual",)),
    ("plotly", ("plotly",)),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def collect() -> dict[str, Any]:
    """Everything `memdoc info` shows, as data."""
    # Imported here: every `memdoc` command builds this module's parser.
    import platform

    import psutil

    from memdoc.collectors.host import find_cgroup
    from memdoc.collectors.nvml_gate import NvmlUnavailable, open_gate
    from memdoc.trace.model import allowlisted_env

    vm = psutil.virtual_memory()
    info: dict[str, Any] = {
        "memdoc": __version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "host_memory_total_bytes": vm.total,
        "host_memory_available_bytes": vm.available,
        "packages": {name: _version(dists) for name, dists in _PACKAGES},
        "env": allowlisted_env(os.environ),
    }
    cgroup = find_cgroup(os.getpid())
    if cgroup is not None:
        values = {k.metric: v for k, v in cgroup.read().items()}
        info["cgroup"] = {"version": cgroup.version, **values}
    try:
        gate = open_gate()
    except NvmlUnavailable as exc:
        info["nvml"] = {"available": False, "reason": exc.reason, "hint": exc.hint}
        return info
    try:
        devices = []
        for device in gate.devices():
            mem = gate.memory(device.index)
            devices.append(
                {
                    "index": device.index,
                    "name": device.name,
                    "parent_index": device.parent_index,
                    "total_bytes": mem.total_bytes,
                    "used_bytes": mem.used_bytes,
                    "processes": len(gate.processes(device.index)),
                }
            )
        info["nvml"] = {"available": True, "driver": gate.driver_version(), "devices": devices}
    finally:
        gate.close()
    return info


def _version(dists: tuple[str, ...]) -> str | None:
    import importlib.metadata

    for dist in dists:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def run(args: argparse.Namespace) -> int:
    info = collect()
    if args.json:
        print(json.dumps(info, indent=2))  # ASCII: JSON escapes every control character
        return 0
    _say(f"memdoc {info['memdoc']} · Python {info['python']} · {info['platform']}")
    _say(
        f"host memory: {format_bytes(info['host_memory_total_bytes'])} total, "
        f"{format_bytes(info['host_memory_available_bytes'])} available"
    )
    cgroup = info.get("cgroup")
    if cgroup:
        limit = cgroup.get("cgroup.limit")
        _say(
            f"cgroup v{cgroup['version']}: limit {format_bytes(limit) if limit else 'none'}, "
            f"usage {format_bytes(cgroup.get('cgroup.usage'))}, "
            f"OOM kills {cgroup.get('cgroup.oom_kills', '-')}"
        )
    nvml = info["nvml"]
    if nvml["available"]:
        _say(f"NVIDIA driver {nvml['driver']}, {len(nvml['devices'])} device(s):")
        for d in nvml["devices"]:
            mig = f" (MIG on GPU {d['parent_index']})" if d["parent_index"] is not None else ""
            _say(
                f"  [{d['index']}] {d['name']}{mig}: {format_bytes(d['used_bytes'])} used of "
                f"{format_bytes(d['total_bytes'])}, {d['processes']} process(es)"
            )
    else:
        _say(nvml["reason"])
        if nvml.get("hint"):
            _say(f"  hint: {nvml['hint']}")
    _say("packages:")
    for name, version in info["packages"].items():
        _say(f"  {name:<13} {version or 'not installed'}")
    _say("memory-relevant environment:")
    if not info["env"]:
        _say("  (none set)")
    for key, value in info["env"].items():
        _say(f"  {key}={value}")
    return 0


def _say(line: str) -> None:
    """Names, versions and environment values come from outside memdoc: shown, never obeyed."""
    print(printable(line))
