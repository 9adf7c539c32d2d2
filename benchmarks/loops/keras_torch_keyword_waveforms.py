"""Train a keyword spotter on raw waveforms with Keras (torch backend), at a batch size
whose training step does not fit.

The model is an M5-style 1D convolutional net read straight from the audio: one-second
clips at 16 kHz (16,000 samples), a first convolution of 32 filters 80 samples wide with
stride 4, then three more convolutions, each followed by batch normalisation, ReLU and
max pooling, and a classifier over 12 keywords. The first block's feature maps are 3,981
steps x 32 channels, 0.5 MiB a clip for each tensor autograd keeps (the convolution's
output, the normalised and activated maps, and the torch backend's channels-first
copies), and the first convolution, a matrix product over the unfolded input on the CPU,
briefly needs 1.2 MiB a clip more. The author copied the batch of 384 from an image
recipe: each of those tensors is then 190 MiB, the first convolution alone needs 680 MiB,
and the step's working set is well over the 1 GiB there is, so the first step of fit runs
out in its first block, while the model itself is 100 KiB. (A batch of 32 trains under the
same cap; or keep the batch and accumulate gradients over smaller pieces.)
"""

from __future__ import annotations

import os
import resource

os.environ["KERAS_BACKEND"] = "torch"

import keras
import numpy as np
import torch

BUDGET_BYTES = 1024 << 20  # as on a machine with 1 GiB to spare
RATE, KEYWORDS, CLIPS, BATCH = 16_000, 12, 6144, 384


def cap_address_space(budget_bytes: int) -> None:
    """Allow this process `budget_bytes` more address space, so it fails in seconds."""
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * resource.getpagesize()
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = mapped + budget_bytes
    resource.setrlimit(resource.RLIMIT_AS, (soft if hard < 0 else min(soft, hard), hard))


class SpokenKeywords(keras.utils.PyDataset):
    """Stands in for a folder of WAV files: each keyword is a chirp at its own pitch."""

    def __init__(self, batch_size: int) -> None:
        super().__init__()
        self.batch_size = batch_size
        self.time = np.arange(RATE, dtype=np.float32) / RATE

    def __len__(self) -> int:
        return CLIPS // self.batch_size

    def __getitem__(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        rng = np.random.default_rng(index)
        keywords = rng.integers(0, KEYWORDS, self.batch_size).astype(np.int32)
        pitch = np.float32(200.0) + np.float32(60.0) * keywords[:, None] + 40 * self.time
        onset = rng.uniform(0.0, 0.4, (self.batch_size, 1)).astype(np.float32)
        envelope = np.exp(-(((self.time - onset - 0.3) / 0.15) ** 2))
        clips = envelope * np.sin(np.float32(2 * np.pi) * pitch * self.time)
        clips += 0.05 * rng.standard_normal(clips.shape, dtype=np.float32)
        return clips[..., None], keywords


def conv_block(x, filters: int, width: int, stride: int = 1):
    x = keras.layers.Conv1D(filters, width, strides=stride)(x)
    x = keras.layers.BatchNormalization()(x)
    x = keras.layers.ReLU()(x)
    return keras.layers.MaxPooling1D(4)(x)


def build_m5() -> keras.Model:
    waveform = keras.Input((RATE, 1))
    x = conv_block(waveform, 32, 80, stride=4)
    x = conv_block(x, 32, 3)
    x = conv_block(x, 64, 3)
    x = conv_block(x, 64, 3)
    x = keras.layers.GlobalAveragePooling1D()(x)
    return keras.Model(waveform, keras.layers.Dense(KEYWORDS)(x))


def main() -> None:
    keras.utils.set_random_seed(0)
    torch.ones(1 << 20).sum()  # start the thread pool before the cap: its stacks count
    # oneDNN reports a failed allocation as "could not create a primitive"; the plain kernels
    # raise the allocator's own error, as on a GPU.
    torch.backends.mkldnn.enabled = False
    cap_address_space(BUDGET_BYTES)
    model = build_m5()
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    print(f"M5 keyword spotter: {model.count_params()} weights, batch {BATCH}", flush=True)
    model.fit(SpokenKeywords(BATCH), epochs=2, verbose=2)
    print("fit finished")


if __name__ == "__main__":
    main()
