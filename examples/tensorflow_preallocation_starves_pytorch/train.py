"""Augment images with TensorFlow, then train on them with PyTorch, in one process.

The bug: the first TensorFlow operation on the GPU makes TensorFlow reserve nearly all of the
GPU's memory for its own allocator (memory growth is off by default). The augmentation needs
a few MiB; PyTorch, which comes second, finds the GPU full and fails on a small model.
`nvidia-smi` shows the GPU full before PyTorch allocated anything. The fix is one line before
TensorFlow touches the GPU: `tf.config.experimental.set_memory_growth(gpu, True)` (or
`TF_FORCE_GPU_ALLOW_GROWTH=true`), or hiding the GPU from TensorFlow.

GPU only (TensorFlow does not pre-allocate host memory), and it needs TensorFlow with GPU
support next to PyTorch.
"""

from __future__ import annotations

import sys

import tensorflow as tf
import torch
import torch.nn.functional as F
from torch import nn

IMAGE_SIZE = 224
BATCH_SIZE = 64


def augmented_batch() -> tf.Tensor:
    images = tf.random.uniform((BATCH_SIZE, IMAGE_SIZE, IMAGE_SIZE, 3))
    images = tf.image.random_flip_left_right(images)
    return tf.image.random_brightness(images, max_delta=0.2)


def make_model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 64, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(64, 10),
    )


def main() -> None:
    if not tf.config.list_physical_devices("GPU") or not torch.cuda.is_available():
        sys.exit("this example needs a CUDA GPU visible to both TensorFlow and PyTorch")
    # Check the input pipeline first: TensorFlow's first GPU operation reserves the GPU.
    print(f"input pipeline ok: {augmented_batch().shape}", flush=True)

    device = torch.device("cuda")
    model = make_model().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(1, 11):
        images = augmented_batch()
        inputs = torch.from_numpy(images.numpy()).permute(0, 3, 1, 2).to(device)
        targets = torch.randint(10, (BATCH_SIZE,), device=device)
        loss = F.cross_entropy(model(inputs), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {step}: loss {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
