"""accelerate's batch-size finder retrying after out-of-memory errors: each try holds a
`Sentinel` in its frame, which the error's traceback keeps; once the finder has caught the
error and tries again, the failed try's frame must be gone, as in a run without memdoc (a
finder retrying while the last try's tensors are still alive finds a smaller size than the
program would alone). Prints how many failed tries were still alive at the next try."""

import weakref

import torch
from accelerate.utils import find_executable_batch_size


class Sentinel:
    pass


tries: list[weakref.ref[Sentinel]] = []
kept: list[int] = []


@find_executable_batch_size(starting_batch_size=64)
def train(batch_size: int) -> int:
    kept.append(sum(alive() is not None for alive in tries))
    sentinel = Sentinel()
    tries.append(weakref.ref(sentinel))
    if batch_size > 40:  # a request the CPU allocator refuses
        torch.empty(batch_size << 40, dtype=torch.uint8)
    return batch_size


print("trained at", train(), "with", max(kept), "failed tries alive", flush=True)
