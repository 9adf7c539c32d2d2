"""A recording's place in a job, from what SLURM, torchrun and Kubernetes tell it."""

from __future__ import annotations

import pytest

from memdoc.metrics.identity import JobIdentity, job_identity
from memdoc.trace.model import ProcessInfo

TORCHRUN = ["torchrun", "--nnodes", "2", "--nproc-per-node", "4", "train.py"]


@pytest.mark.parametrize(
    ("environ", "command", "expected"),
    [
        pytest.param({}, [], JobIdentity("h"), id="nothing-known"),
        pytest.param(
            {"SLURM_JOB_ID": "81", "SLURM_NODEID": "3", "SLURM_PROCID": "12", "SLURM_LOCALID": "0"},
            [],
            JobIdentity("h", job="81", node_rank=3, rank=12, local_rank=0),
            id="slurm",
        ),
        pytest.param(
            {"TORCHELASTIC_RUN_ID": "abc", "GROUP_RANK": "1", "RANK": "5", "LOCAL_RANK": "1"},
            [],
            JobIdentity("h", job="abc", node_rank=1, rank=5, local_rank=1),
            id="inside-a-torchrun-rank",
        ),
        pytest.param(
            {},
            [*TORCHRUN[:3], "--node-rank", "1", "--rdzv-id", "exp7", *TORCHRUN[3:]],
            JobIdentity("h", job="exp7", node_rank=1),
            id="wrapping-torchrun",
        ),
        pytest.param(
            {},
            [*TORCHRUN[:3], "--node_rank=2", "--rdzv_id=exp8", *TORCHRUN[3:]],
            JobIdentity("h", job="exp8", node_rank=2),
            id="wrapping-torchrun-underscores",
        ),
        pytest.param(
            {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "HOSTNAME": "train-worker-3"},
            [],
            JobIdentity("h", job="train-worker-3"),
            id="kubernetes-pod",
        ),
        pytest.param(
            {"HOSTNAME": "laptop"}, [], JobIdentity("h"), id="a-hostname-outside-kubernetes"
        ),
        pytest.param(
            {"SLURM_JOB_ID": "81", "POD_NAME": "p"},
            [],
            JobIdentity("h", job="81"),
            id="slurm-first",
        ),
        pytest.param(
            {"NODE_RANK": "x", "RANK": "-1"}, [], JobIdentity("h"), id="numbers-that-are-not"
        ),
    ],
)
def test_identity_comes_from_the_launcher(
    environ: dict[str, str], command: list[str], expected: JobIdentity
) -> None:
    assert job_identity(environ, command, host="h") == expected


@pytest.mark.parametrize(
    ("identity", "name"),
    [
        pytest.param(JobIdentity("gpu-07"), "memdoc-gpu-07-42.memdoc", id="one-node"),
        pytest.param(
            JobIdentity("gpu-07", node_rank=3), "memdoc-gpu-07-node3-42.memdoc", id="node"
        ),
        pytest.param(
            JobIdentity("gpu-07", node_rank=0, rank=5),
            "memdoc-gpu-07-node0-rank5-42.memdoc",
            id="a-rank-of-its-own",
        ),
        pytest.param(JobIdentity("a/b c"), "memdoc-a_b_c-42.memdoc", id="odd-host-name"),
    ],
)
def test_trace_names_are_unique_per_host_node_rank_and_pid(
    identity: JobIdentity, name: str
) -> None:
    assert identity.trace_name(42) == name


@pytest.mark.parametrize(
    ("environ", "world_size"),
    [
        pytest.param(
            {"SLURM_PROCID": "12", "SLURM_LOCALID": "0", "SLURM_NTASKS": "16"}, 16, id="slurm"
        ),
        pytest.param(
            {
                "OMPI_COMM_WORLD_RANK": "3",
                "OMPI_COMM_WORLD_LOCAL_RANK": "1",
                "OMPI_COMM_WORLD_SIZE": "4",
            },
            4,
            id="mpi",
        ),
        pytest.param({"RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8"}, 8, id="torchrun"),
        pytest.param({"RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "-8"}, None, id="not-a-size"),
    ],
)
def test_the_trace_header_and_the_rank_watcher_read_the_rank_the_exporter_reads(
    monkeypatch: pytest.MonkeyPatch, environ: dict[str, str], world_size: int | None
) -> None:
    from memdoc.collectors.launcher import (
        LOCAL_RANK_VARIABLES,
        RANK_VARIABLES,
        WORLD_SIZE_VARIABLES,
    )
    from memdoc.run.agent import LaunchRankWatcher
    from memdoc.session import header_for_this_process

    for name in (*RANK_VARIABLES, *LOCAL_RANK_VARIABLES, *WORLD_SIZE_VARIABLES):
        monkeypatch.delenv(name, raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    identity = job_identity(environ, host="h")
    assert identity.rank is not None

    header = header_for_this_process(["train.py"], interval_s=0.1, mode="watch")
    seen: list[ProcessInfo] = []
    watcher = LaunchRankWatcher()
    watcher.start(_Recorder(seen))
    monkeypatch.setenv("RANK", "99")  # as mp.spawn-style code sets it inside the worker
    watcher.sample(1.0)

    assert header.rank == identity.rank
    assert header.world_size == world_size
    assert [(p.rank, p.local_rank) for p in seen] == [(99, identity.local_rank)]


class _Recorder:
    def __init__(self, seen: list[ProcessInfo]) -> None:
        self.seen = seen

    def process(self, info: ProcessInfo) -> None:
        self.seen.append(info)
