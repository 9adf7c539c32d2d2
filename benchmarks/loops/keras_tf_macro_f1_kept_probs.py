"""Fit a product-categorisation model with Keras (TensorFlow backend) and an exact macro-F1
metric that keeps every batch's predicted probabilities until the epoch's end.

Each product is a 256-float text embedding and belongs to one of 2000 leaf categories.
Keras's built-in F1 score wants one-hot targets and thresholds, so the author wrote a
`MacroF1` metric the simple way: `update_state` appends the batch's labels and its
(1024, 2000) probabilities to two lists, and `result` concatenates them and computes the
exact macro-F1 over everything seen this epoch; `reset_state` empties the lists when the
next epoch starts. A Python list of tensors does not survive `tf.function` tracing, so the
model is compiled with `run_eagerly=True`, and then the metric "works". But every step keeps
8 MiB of probabilities, and `result`, which Keras calls after every batch to log the
metrics, concatenates all of them again and takes their argmax (a few times as much,
briefly): memory grows by 8 MiB and more a step and the fit runs out after about thirty of
the first epoch's 96 steps, though the model, its Adam state and the data take about
110 MiB. (Keep only each batch's argmax, or
count a 2000 x 2000 confusion matrix in a variable: the fit then trains under the same
cap.)
"""

from __future__ import annotations

import os
import resource

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
os.environ["KERAS_BACKEND"] = "tensorflow"

import keras
import numpy as np
import tensorflow as tf
from keras import ops

BUDGET_BYTES = 2048 << 20  # as on a machine with 2 GiB to spare
FEATURES, HIDDEN, CATEGORIES, ROWS, BATCH = 256, 512, 2000, 98_304, 1024


def cap_address_space(budget_bytes: int) -> None:
    """Allow this process `budget_bytes` more address space, so it fails in seconds."""
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * resource.getpagesize()
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = mapped + budget_bytes
    resource.setrlimit(resource.RLIMIT_AS, (soft if hard < 0 else min(soft, hard), hard))


class MacroF1(keras.metrics.Metric):
    """Exact macro-averaged F1 over the epoch's predictions."""

    def __init__(self, categories: int, name: str = "macro_f1") -> None:
        super().__init__(name=name)
        self.categories = categories
        self.labels: list = []
        self.probabilities: list = []

    def update_state(self, y_true, y_pred, sample_weight=None) -> None:
        self.labels.append(ops.cast(ops.reshape(y_true, (-1,)), "int32"))
        self.probabilities.append(y_pred)  # BUG: the whole (batch, 2000) tensor, every step

    def result(self):
        if not self.labels:
            return ops.convert_to_tensor(0.0)
        labels = ops.concatenate(self.labels)
        predicted = ops.cast(ops.argmax(ops.concatenate(self.probabilities), axis=-1), "int32")
        confusion = tf.math.bincount(
            labels * self.categories + predicted, minlength=self.categories**2
        )
        confusion = ops.cast(ops.reshape(confusion, (self.categories, self.categories)), "float32")
        right = ops.diagonal(confusion)
        precision = right / ops.maximum(ops.sum(confusion, axis=0), 1.0)
        recall = right / ops.maximum(ops.sum(confusion, axis=1), 1.0)
        f1 = 2 * precision * recall / ops.maximum(precision + recall, 1e-9)
        seen = ops.cast(ops.sum(confusion, axis=1) > 0, "float32")
        return ops.sum(f1 * seen) / ops.maximum(ops.sum(seen), 1.0)

    def reset_state(self) -> None:
        self.labels.clear()
        self.probabilities.clear()


def make_products(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Stands in for embedded product titles: each category has its own centre."""
    categories = rng.integers(0, CATEGORIES, ROWS)
    centres = rng.standard_normal((CATEGORIES, FEATURES), dtype=np.float32)
    noise = rng.standard_normal((ROWS, FEATURES), dtype=np.float32)
    return centres[categories] + 2.0 * noise, categories.astype(np.int32)


def make_model() -> keras.Model:
    model = keras.Sequential(
        [
            keras.Input((FEATURES,)),
            keras.layers.Dense(HIDDEN, activation="relu"),
            keras.layers.Dropout(0.1),
            keras.layers.Dense(CATEGORIES, activation="softmax"),
        ]
    )
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(),
        metrics=[MacroF1(CATEGORIES)],
        run_eagerly=True,  # so that MacroF1's Python lists work
    )
    return model


def main() -> None:
    keras.utils.set_random_seed(0)
    tf.ones(4).numpy()  # start TensorFlow's thread pools before the cap: their stacks count
    cap_address_space(BUDGET_BYTES)
    features, categories = make_products(np.random.default_rng(0))
    print(f"{ROWS} products, {features.nbytes >> 20} MiB of features", flush=True)
    model = make_model()
    model.fit(features, categories, batch_size=BATCH, epochs=3, verbose=2)
    print("fit finished")


if __name__ == "__main__":
    main()
