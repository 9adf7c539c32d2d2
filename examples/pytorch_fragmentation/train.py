"""Run batches of documents of varying length on the GPU and keep some of the outputs.

The bug is an allocator one: a batch of long documents makes PyTorch's caching allocator
reserve large segments; the next batch, of short documents, is carved out of those segments,
and the outputs kept from it pin every segment in place. Half the memory is then free, but
in pieces smaller than the next long document needs: "reserved but unallocated" is large
when the error comes. `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` avoids it.

GPU only: the CPU allocator returns freed memory to the system and does not fragment this way.
"""

from __future__ import annotations

import sys

import torch


def run_batch(lengths: list[int], device: torch.device) -> list[torch.Tensor]:
    """One output per document, as large as the document (stands in for a model)."""
    return [torch.randn(length, device=device) for length in lengths]


def main() -> None:
    if not torch.cuda.is_available():
        sys.exit("this example needs a CUDA GPU: the CPU allocator does not fragment this way")
    device = torch.device("cuda")
    # One "percent" is the number of float32 values that take 1% of the device.
    percent = torch.cuda.get_device_properties(device).total_memory // 100 // 4

    # 1. Eight long documents, 11% of the device each. Nothing is kept, but the allocator
    #    keeps the eight segments cached for reuse.
    run_batch([11 * percent] * 8, device)
    print(f"reserved: {torch.cuda.memory_reserved() / 2**30:.1f} GiB", flush=True)

    # 2. Sixteen short documents, 5% each, two to a cached segment. Every other output
    #    passes the filter and is kept, so no segment is ever entirely free again.
    outputs = run_batch([5 * percent] * 16, device)
    kept = outputs[::2]
    del outputs
    print(
        f"allocated: {torch.cuda.memory_allocated() / 2**30:.1f} GiB, "
        f"reserved: {torch.cuda.memory_reserved() / 2**30:.1f} GiB",
        flush=True,
    )

    # 3. One long document needs 15% in one piece: free memory exists, but not in one piece.
    (long_output,) = run_batch([15 * percent], device)
    print(f"done: {len(kept)} outputs kept, last one {long_output.numel()} values")


if __name__ == "__main__":
    main()
