"""What a launcher (torchrun, SLURM, Open MPI) told this process: its rank in the job."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

RANK_VARIABLES = ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK")
LOCAL_RANK_VARIABLES = ("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK")
WORLD_SIZE_VARIABLES = ("WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE")


def launcher_ranks(environ: Mapping[str, str]) -> tuple[int | None, int | None]:
    """(rank, local rank) as the launcher set them; None where it set none (or not a number)."""
    return first_int(environ, RANK_VARIABLES), first_int(environ, LOCAL_RANK_VARIABLES)


def launcher_world_size(environ: Mapping[str, str]) -> int | None:
    """How many ranks the launcher started; None where it did not say."""
    return first_int(environ, WORLD_SIZE_VARIABLES)


def first_int(environ: Mapping[str, str], names: Sequence[str]) -> int | None:
    """The first of `names` set to a whole number, as a number."""
    for name in names:
        value = whole_number(environ.get(name))
        if value is not None:
            return value
    return None


def whole_number(text: str | None) -> int | None:
    """`text` as a number when it is one written in digits alone (no sign, no spaces)."""
    return int(text) if text is not None and text.isascii() and text.isdigit() else None
