"""The cues the recogniser reads from the words around a host memory failure."""

from __future__ import annotations

import pytest

from memdoc.oom.hostcues import HostCues, Killer, Scheduler, WorkerEnd, host_cues


@pytest.mark.parametrize(
    ("texts", "killer"),
    [
        pytest.param(["Out of memory: Killed process 4242 (python)"], Killer.KERNEL, id="dmesg"),
        pytest.param(["Memory cgroup out of memory: Kill process 9"], Killer.KERNEL, id="cgroup"),
        pytest.param(["Last State: Terminated, Reason: OOMKilled"], Killer.KERNEL, id="k8s"),
        pytest.param(
            ["Your session crashed after using all available RAM."], Killer.PLATFORM, id="colab"
        ),
        pytest.param(
            ["slurmstepd: error: Job 12 exceeded memory limit (900 > 800), being killed"],
            Killer.PLATFORM,
            id="slurm",
        ),
        pytest.param(["the job was OOM killed"], Killer.PLATFORM, id="scheduler-words"),
        pytest.param(["Killed"], None, id="bare-kill"),
    ],
)
def test_who_stopped_the_job_is_read_from_its_words(
    texts: list[str], killer: Killer | None
) -> None:
    assert host_cues(texts).killed_by == killer


def test_the_kernels_words_weigh_before_a_platforms_in_any_text() -> None:
    # GIVEN a platform's notice in the message and the kernel's line in the log around it
    cues = host_cues(["exceeded memory limit", "oom-kill:constraint=CONSTRAINT_MEMCG,pid=7"])
    # THEN the kernel is named: its words are the surer sign
    assert cues.killed_by == Killer.KERNEL


@pytest.mark.parametrize(
    ("text", "scheduler"),
    [
        pytest.param("slurmstepd: error: Detected 1 oom-kill event", Scheduler.SLURM, id="slurm"),
        pytest.param("srun: error: task 0: Killed", Scheduler.SLURM, id="srun"),
        pytest.param("The node was low on resource: memory.", Scheduler.KUBERNETES, id="evicted"),
        pytest.param("Killed", None, id="none"),
    ],
)
def test_the_scheduler_is_the_one_the_text_names(text: str, scheduler: Scheduler | None) -> None:
    assert host_cues([text]).scheduler == scheduler


def test_a_compiler_killed_while_building_is_a_build() -> None:
    text = "gcc: fatal error: Killed signal terminated program cc1plus"
    assert host_cues([text]).compiler
    assert not host_cues(["python train.py Killed"]).compiler


@pytest.mark.parametrize(
    ("text", "end"),
    [
        pytest.param("is killed by signal: Killed.", WorkerEnd.KILLED, id="sigkill"),
        pytest.param("is killed by signal: Terminated.", WorkerEnd.TERMINATED, id="sigterm"),
        pytest.param("exited unexpectedly", None, id="unknown"),
    ],
)
def test_a_workers_end_is_its_signal(text: str, end: WorkerEnd | None) -> None:
    assert host_cues([f"DataLoader worker (pid 12) {text}"]).worker_end == end


def test_shared_memory_is_named_by_its_words_or_by_torchs_segments() -> None:
    segment = host_cues(["unable to write to file </torch_123_456>"])
    assert segment.shared_memory and not segment.shared_memory_words
    assert host_cues(["No space left on device: /dev/shm"]).shared_memory_words
    assert host_cues(["Bus error (core dumped)"]) == HostCues(bus_error=True)


def test_empty_texts_say_nothing() -> None:
    assert host_cues(["", ""]) == HostCues()
