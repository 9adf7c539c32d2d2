"""Thresholds that more than one part of memdoc decides with: each defined once, here, with
the reason for its value. A threshold only one rule uses lives beside that rule, named and
explained there.
"""

from __future__ import annotations

# A device, or a memory limit, is nearly full when less than this share of it is left: the
# allocators' own slack (PyTorch rounds blocks up to 2 MiB and keeps a 20 MiB large-block
# pool; XLA and TensorFlow keep a few percent back) makes a request fail well before the
# last byte, and below a tenth free nothing else (a library handle, a workspace) finds room.
NEARLY_FULL_FREE_SHARE = 0.1

# The share of a device below which memory left unused (a cache, a pool, a free remainder)
# cannot change the outcome of an error: smaller than the usual request of a step.
SIGNIFICANT_SHARE = 0.02


def nearly_full(used: float, total: float) -> bool:
    """True when `used` leaves less than NEARLY_FULL_FREE_SHARE of `total` (total > 0)."""
    return total > 0 and used >= (1 - NEARLY_FULL_FREE_SHARE) * total


def little_free(free: float, total: float) -> bool:
    """True when `free` is at most NEARLY_FULL_FREE_SHARE of `total` (total > 0): the same
    boundary as `nearly_full`, read from the free side."""
    return total > 0 and free <= NEARLY_FULL_FREE_SHARE * total


# A model's weights and the gradients they take fill what a program held when its first
# step ran out at this share or more: a smaller batch leaves them where they are, so the
# model, not the step's working set, is what does not fit. The gradients count before they
# exist (a forward pass that runs out has made none), so the share reaches 1 wherever the
# weights and their gradients could never fit together; below 0.8 a batch with a fifth of
# the memory to itself may still fit. (A BERT-base fine-tune whose first backward ran out
# held 836 MiB of weights and gradients in 941 MiB, 0.89; DGCNN and M5 nets that ran out at
# their batch, under 0.01.)
MODEL_FILLS_SHARE = 0.8
