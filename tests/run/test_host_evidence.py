"""The host numbers a diagnosis quotes are the job's own: its processes, its cgroup, its cap."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from memdoc.rules.facts import failure
from memdoc.rules.host import host_limits
from memdoc.trace import Metric, load_trace
from tests.cgroups import real_memory_cgroup
from tests.conftest import memdoc_cmd

MiB = 1024**2

# Another program in the same cgroup, holding 250 MiB.
HOG = textwrap.dedent(
    """
    import sys, time
    held = bytearray(250 * 1024 * 1024)
    for i in range(0, len(held), 4096):
        held[i] = 1
    print("ready", flush=True)
    time.sleep(60)
    """
)
# The job offers itself to the OOM killer first, then grows until the cgroup is full.
GROWS_UNTIL_KILLED = textwrap.dedent(
    """
    import time
    with open("/proc/self/oom_score_adj", "w") as f:
        f.write("1000")
    blocks = []
    while True:
        block = bytearray(8 * 1024 * 1024)
        for i in range(0, len(block), 4096):
            block[i] = 1
        blocks.append(block)
        time.sleep(0.05)
    """
)


def _diagnose(trace: Path) -> dict:
    out = subprocess.run(
        [*memdoc_cmd("diagnose", "--json", str(trace))], capture_output=True, timeout=120
    )
    return json.loads(out.stdout)


def _evidence(finding: dict) -> dict[str, float]:
    return {e["text"].rpartition(": ")[0]: e["value"] for e in finding["evidence"]}


def test_a_kill_in_a_shared_cgroup_quotes_the_jobs_own_peak_and_names_the_cgroup_limit(
    tmp_path: Path,
) -> None:
    (tmp_path / "hog.py").write_text(HOG)
    (tmp_path / "grow.py").write_text(GROWS_UNTIL_KILLED)
    with real_memory_cgroup() as cgroup:
        cgroup.limit(450 * MiB)
        # Memory is charged to the cgroup a process is in when it touches it: enter first.
        enter = f'echo $$ > {cgroup.directory}/cgroup.procs && exec "$@"'
        hog = subprocess.Popen(
            ["sh", "-c", enter, "sh", sys.executable, "hog.py"],
            cwd=tmp_path,
            stdout=subprocess.PIPE,
        )
        try:
            assert hog.stdout is not None and hog.stdout.readline() == b"ready\n"
            # GIVEN memdoc run, started inside the cgroup the hog also lives in
            command = memdoc_cmd("run", "-q", "-o", "t.memdoc", "--interval", "0.05", "grow.py")
            env = {k: v for k, v in os.environ.items() if k != "MEMDOC_AGENT"}
            # WHEN the job grows until the kernel's OOM killer ends it
            run = subprocess.run(
                ["sh", "-c", enter, "sh", *command], cwd=tmp_path, env=env, timeout=120
            )
        finally:
            hog.kill()
            hog.wait()

    assert run.returncode == -9
    trace = load_trace(tmp_path / "t.memdoc")
    others = trace.series(Metric.CGROUP_OTHER_PROCESSES)
    assert others is not None and max(others.values) >= 1  # the hog
    cgroup_peak = trace.peak(Metric.CGROUP_USAGE)
    job_peak = trace.peak(Metric.HOST_RSS)
    assert cgroup_peak is not None and job_peak is not None
    assert cgroup_peak[1] >= 250 * MiB and cgroup_peak[1] > job_peak[1]  # the hog counted
    # THEN the diagnosis quotes the job's own resident memory, and the cgroup limit by name
    host = [f for f in _diagnose(tmp_path / "t.memdoc")["findings"] if f["rule"] == "host-oom"]
    assert host, "host-oom did not fire"
    evidence = _evidence(host[0])
    assert evidence["peak resident memory of the job"] == job_peak[1]
    limit = f"memory limit of cgroup {cgroup.path} (memory.limit_in_bytes)"
    if cgroup.version == 2:
        limit = f"memory limit of cgroup {cgroup.path} (memory.max)"
    assert evidence[limit] == 450 * MiB


# A worker that moves itself into a cgroup of its own (as a job step does), caps its own
# address space and runs out: memdoc's sampler only ever saw the program's cgroup.
WORKER_IN_ITS_OWN_CGROUP = textwrap.dedent(
    """
    import subprocess, sys
    worker = '''
    import os, resource, sys
    with open(sys.argv[1] + "/cgroup.procs", "w") as procs:
        procs.write(str(os.getpid()))
    cap = 700 * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    blocks = []
    while True:
        blocks.append(bytearray(16 * 1024 * 1024))
    '''
    sys.exit(subprocess.run([sys.executable, "-c", worker, sys.argv[1]]).returncode)
    """
)


def test_the_failing_processs_own_cgroup_limit_is_read_at_the_error(tmp_path: Path) -> None:
    (tmp_path / "steps.py").write_text(WORKER_IN_ITS_OWN_CGROUP)
    with real_memory_cgroup() as step:
        step.limit(3 * 1024 * MiB)
        run = subprocess.run(
            [*memdoc_cmd("run", "-q", "-o", "t.memdoc", "steps.py", str(step.directory))],
            cwd=tmp_path,
            capture_output=True,
            env={k: v for k, v in os.environ.items() if k != "MEMDOC_AGENT"},
            timeout=120,
        )

    assert run.returncode == 1, run.stderr[-2000:]
    trace = load_trace(tmp_path / "t.memdoc")
    fail = failure(trace)
    assert fail is not None and fail.host["cgroup_limit_bytes"] == 3 * 1024 * MiB
    limits = {limit.label: limit.limit_bytes for limit in host_limits(trace, fail.pid, fail.host)}
    assert limits[f"memory limit of the cgroup of process {fail.pid}"] == 3 * 1024 * MiB
    assert limits[f"address-space cap (RLIMIT_AS) of process {fail.pid}"] == 700 * MiB
