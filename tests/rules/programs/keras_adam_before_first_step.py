"""Keras `fit` (torch backend) under an address-space cap 448 MiB above what the process
maps once its data is made, with Adam. `fit` builds Adam's two moments before its first
step; what that step then needs decides the run.

MODEL=table (default): a 128 MiB embedding table; its moments take 256 MiB, and the first
step's backward pass runs out allocating the table's dense gradient (with SGD, which keeps
no moments, the same fit trains).
MODEL=wide: 8 MiB of dense weights (Adam's moments 16 MiB) and batches of 8192 rows whose
hidden layer is 8192 wide: the first step runs out on its 256 MiB activations, moments or
not (with SGD too)."""

import os
import resource

os.environ.setdefault("KERAS_BACKEND", "torch")

import keras
import numpy as np
import torch

torch.ones(1 << 20).sum()  # start the thread pool before the cap: its stacks count
torch.backends.mkldnn.enabled = False  # the plain kernels raise the allocator's own error
keras.utils.set_random_seed(0)
if os.environ.get("MODEL", "table") == "table":
    x = np.random.randint(0, 1 << 20, (4096, 8)).astype(np.int32)
    model = keras.Sequential(
        [keras.Input((8,), dtype="int32"), keras.layers.Embedding(1 << 20, 32),
         keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(1)]
    )  # fmt: skip
    batch = 512
else:
    x = np.random.rand(16384, 256).astype(np.float32)
    model = keras.Sequential(
        [keras.Input((256,)), keras.layers.Dense(8192, activation="relu"), keras.layers.Dense(1)]
    )
    batch = 8192
y = np.zeros((len(x), 1), np.float32)
model.compile(optimizer=os.environ.get("OPTIMIZER", "adam"), loss="mse")
with open("/proc/self/statm") as statm:
    mapped = int(statm.read().split()[0]) * resource.getpagesize()
_, hard = resource.getrlimit(resource.RLIMIT_AS)
resource.setrlimit(resource.RLIMIT_AS, (mapped + (448 << 20), hard))
model.fit(x, y, batch_size=batch, epochs=1, verbose=0)
print("fit finished")
