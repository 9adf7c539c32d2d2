"""Train a CT-slice classifier (lesion or not) with the Hugging Face Trainer and two
DataLoader workers, whose dataset keeps every decoded scan in a dictionary: each worker
fills its own copy of the cache in host memory until it runs out.

The model is a small ViT built from its config (64 x 64 single-channel slices in patches
of 8, 4 layers of 128, 0.8 million weights). The dataset has 1024 scans of 64 slices; a
training example is one slice, downsampled to 64 x 64, labelled by whether it crosses the
scan's lesion. Reading a slice means decoding its whole series (64 x 128 x 128 Hounsfield
units, windowed to float32, 4 MiB), so the dataset memoizes decoded volumes in
`self._volumes` to decode each scan once. With `dataloader_num_workers=2` every worker
process has its own copy of the dataset and of that cache, and the Trainer's shuffled
sampler sends each worker slices of new scans nearly every time: a batch of 16 slices adds
about 64 MiB to the worker that builds it, and none is ever evicted. The main process
stays flat, with the model and AdamW's state under 20 MiB; each worker grows by 64 MiB a
batch until one reaches the 1 GiB cap it inherited from the main process, after a dozen or
so batches each (about 30 training steps), and the Trainer fails with the worker's
MemoryError. (Extract the downsampled slices to files once,
before training, and let the workers read one slice an example, or drop the cache and
decode the scan each time: the workers then hold only the batches in flight, and it trains
under the same cap.)
"""

from __future__ import annotations

import resource
import tempfile

import numpy as np
import torch
from transformers import Trainer, TrainingArguments, ViTConfig, ViTForImageClassification

BUDGET_BYTES = 1024 << 20  # as on a machine with 1 GiB to spare
SCANS, SLICES, SIDE, INPUT = 1024, 64, 128, 64
BATCH, STEPS = 16, 400


def cap_address_space(budget_bytes: int) -> None:
    """Allow this process `budget_bytes` more address space, so it fails in seconds."""
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * resource.getpagesize()
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = mapped + budget_bytes
    resource.setrlimit(resource.RLIMIT_AS, (soft if hard < 0 else min(soft, hard), hard))


def decode_series(scan: int) -> tuple[np.ndarray, range]:
    """Stands in for reading a DICOM series: a body ellipse of soft tissue in air, and a
    brighter lesion through some of the slices, windowed from Hounsfield units to [0, 1]."""
    rng = np.random.default_rng(scan)
    y, x = np.mgrid[-1 : 1 : SIDE * 1j, -1 : 1 : SIDE * 1j].astype(np.float32)
    body = (x / 0.8) ** 2 + (y / 0.6) ** 2 < 1.0
    hounsfield = np.where(body, 40.0, -1000.0).astype(np.float32)
    volume = hounsfield + 20.0 * rng.standard_normal((SLICES, SIDE, SIDE), dtype=np.float32)
    first = int(rng.integers(0, SLICES - 8))
    lesion = range(first, first + int(rng.integers(4, 9)))
    cy, cx = rng.uniform(-0.3, 0.3, 2)
    spot = ((x - cx) ** 2 + (y - cy) ** 2 < 0.01).astype(np.float32)
    volume[lesion.start : lesion.stop] += 60.0 * spot
    return np.clip((volume + 160.0) / 400.0, 0.0, 1.0), lesion


class CTSlices(torch.utils.data.Dataset):
    def __init__(self) -> None:
        self._volumes: dict[int, tuple[np.ndarray, range]] = {}  # decoded scans, kept

    def __len__(self) -> int:
        return SCANS * SLICES

    def _volume(self, scan: int) -> tuple[np.ndarray, range]:
        if scan not in self._volumes:  # BUG: every scan ever decoded stays, in every worker
            self._volumes[scan] = decode_series(scan)
        return self._volumes[scan]

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        scan, depth = divmod(index, SLICES)
        volume, lesion = self._volume(scan)
        step = SIDE // INPUT
        image = volume[depth, ::step, ::step]
        return {
            "pixel_values": torch.from_numpy(np.ascontiguousarray(image[None])),
            "labels": torch.tensor(int(depth in lesion)),
        }


def main() -> None:
    torch.manual_seed(0)
    torch.ones(1 << 20).sum()  # start the thread pool before the cap: its stacks count
    # oneDNN reports a failed allocation as "could not create a primitive"; the plain kernels
    # raise the allocator's own error, as on a GPU.
    torch.backends.mkldnn.enabled = False
    cap_address_space(BUDGET_BYTES)
    config = ViTConfig(
        image_size=INPUT,
        patch_size=8,
        num_channels=1,
        hidden_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        intermediate_size=512,
        num_labels=2,
    )
    model = ViTForImageClassification(config)
    weights = sum(p.numel() for p in model.parameters())
    print(f"{weights / 1e6:.1f}M weights", flush=True)
    arguments = TrainingArguments(
        output_dir=tempfile.mkdtemp(prefix="hf-ct-slices-"),
        per_device_train_batch_size=BATCH,
        max_steps=STEPS,
        learning_rate=3e-4,
        logging_steps=5,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        dataloader_num_workers=2,
        disable_tqdm=True,
        remove_unused_columns=False,
        seed=0,
    )
    trainer = Trainer(model=model, args=arguments, train_dataset=CTSlices())
    trainer.train()
    print("training finished")


if __name__ == "__main__":
    main()
