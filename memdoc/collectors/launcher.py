"""What a launcher (torchrun, SLURM, Open MPI) told this process: its rank in the job."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

RANK_VARIABLES = ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK")
LOCAL_RANK_VARIABLES = ("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK")


def launcher_ranks(environ: Mapping[str, str]) -> tuple[int | None, int | None]:
    """(rank, local rank) as the launcher set them; None where it set none (or not a number)."""
    return first_int(environ, RANK_VARIABLES), first_int(environ, LOCAL_RANK_VARIABLES)


def first_int(environ: Mapping[str, str], names: Sequence[str]) -> int | None:
    """The first of `names` set to a whole number, as a number."""
    for name in names:
        value = environ.get(name)
        if value is not None and value.isdigit():
            return int(value)
    return None
