"""A recording's place in a job, from what SLURM, torchrun and Kubernetes tell it."""

from __future__ import annotations

import pytest

from memdoc.metrics.identity import JobIdentity, job_identity

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
