"""Who this process is in a cluster job: host, job id, node rank, rank, from the launcher."""

from __future__ import annotations

import re
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from memdoc.collectors.launcher import first_int, launcher_ranks, whole_number
from memdoc.printable import printable

# The first variable that is set names the job: SLURM, then torchrun (elastic), then a
# Kubernetes pod (whose HOSTNAME is the pod name).
_JOB_VARIABLES = ("MEMDOC_JOB_ID", "SLURM_JOB_ID", "TORCHELASTIC_RUN_ID", "POD_NAME")
_NODE_VARIABLES = ("NODE_RANK", "GROUP_RANK", "SLURM_NODEID", "OMPI_COMM_WORLD_NODE_RANK")
# torchrun's own options, in both spellings it accepts: `--node-rank 1`, `--node_rank=1`.
_NODE_RANK_OPTION = re.compile(r"^--node[-_]rank(?:=(\d+))?$")
_RDZV_ID_OPTION = re.compile(r"^--rdzv[-_]id(?:=(.+))?$")
_SAFE_NAME = re.compile(r"[^A-Za-z0-9._-]+")
# A label value is at most this long: an identity, not a document.
MAX_LABEL_CHARS = 200


@dataclass(frozen=True)
class JobIdentity:
    """Where a recording sits in a job; None where the launcher did not say."""

    host: str
    job: str | None = None
    node_rank: int | None = None
    rank: int | None = None
    local_rank: int | None = None

    def trace_name(self, pid: int) -> str:
        """A file name no other node or rank of the job can take: host, node rank, pid."""
        parts = ["memdoc", _safe(self.host)]
        if self.node_rank is not None:
            parts.append(f"node{self.node_rank}")
        if self.rank is not None:
            parts.append(f"rank{self.rank}")
        parts.append(str(pid))
        return "-".join(parts) + ".memdoc"


def job_identity(
    environ: Mapping[str, str], command: Sequence[str] = (), host: str | None = None
) -> JobIdentity:
    """This recording's identity from the launcher's environment and, for a wrapped
    `torchrun`, its `--node-rank` and `--rdzv-id` options (the parent of torchrun has no
    rank variables: torchrun sets them in the ranks only)."""
    job = _first_text(environ, _JOB_VARIABLES) or _option(command, _RDZV_ID_OPTION)
    if job is None and environ.get("KUBERNETES_SERVICE_HOST"):
        job = environ.get("HOSTNAME") or None  # in a pod, HOSTNAME is the pod's name
    node = first_int(environ, _NODE_VARIABLES)
    if node is None:
        node = whole_number(_option(command, _NODE_RANK_OPTION))
    rank, local_rank = launcher_ranks(environ)
    return JobIdentity(
        host=label_text(host or socket.gethostname()),
        job=None if job is None else label_text(job),
        node_rank=node,
        rank=rank,
        local_rank=local_rank,
    )


def label_text(text: str) -> str:
    """`text` as a label value can carry it: valid UTF-8 (bytes that were not text become
    U+FFFD), no control characters, at most MAX_LABEL_CHARS."""
    return printable(text)[:MAX_LABEL_CHARS]


def _option(command: Sequence[str], pattern: re.Pattern[str]) -> str | None:
    for i, word in enumerate(command):
        found = pattern.match(word)
        if found is None:
            continue
        if found.group(1) is not None:
            return found.group(1)
        return command[i + 1] if i + 1 < len(command) else None
    return None


def _first_text(environ: Mapping[str, str], names: Sequence[str]) -> str | None:
    return next((environ[n] for n in names if environ.get(n)), None)


def _safe(name: str) -> str:
    return _SAFE_NAME.sub("_", name)[:64] or "host"
