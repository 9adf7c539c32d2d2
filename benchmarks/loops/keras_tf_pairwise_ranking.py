"""Fit a learning-to-rank model for a shop's search results with Keras (TensorFlow backend)
and a pairwise RankNet loss that compares every pair of rows in the batch, not only the
pairs of one query.

Each row is one (query, product) pair described by 136 ranking features, and every query
has 32 candidate products with graded relevance from 0 to 4. A batch is 512 whole queries,
16,384 rows, in order (shuffle=False keeps a query's rows together). The loss is meant to
compare the candidates of each query with each other: 512 x 32 x 32 pairs, 2 MiB. But it
was written on the flattened batch, `scores[:, None] - scores[None, :]` with a mask
`same_query[:, None] == same_query[None, :]` to drop the pairs across queries, which
broadcasts to 16,384 x 16,384 matrices: 1 GiB for each float one (256 MiB for each
boolean mask), asked for in the first step, against 1 GiB of memory, while the model, its
Adam state and the 34 MiB of features take under 100 MiB. (Reshape the scores to (512, 32)
and compare within each query, a (512, 32, 32) tensor: it trains under the same cap.)
"""

from __future__ import annotations

import os
import resource

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
os.environ["KERAS_BACKEND"] = "tensorflow"

import keras
import numpy as np
import tensorflow as tf

BUDGET_BYTES = 1024 << 20  # as on a machine with 1 GiB to spare
FEATURES, CANDIDATES, QUERIES, QUERIES_PER_BATCH = 136, 32, 2048, 512


def cap_address_space(budget_bytes: int) -> None:
    """Allow this process `budget_bytes` more address space, so it fails in seconds."""
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * resource.getpagesize()
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = mapped + budget_bytes
    resource.setrlimit(resource.RLIMIT_AS, (soft if hard < 0 else min(soft, hard), hard))


def ranknet_loss(y_true: tf.Tensor, y_pred: tf.Tensor) -> tf.Tensor:
    """Logistic loss on every pair where the first product is more relevant than the second.

    y_true holds (relevance, query id) for each row; y_pred one score a row.
    """
    relevance, query = y_true[:, 0], y_true[:, 1]
    scores = y_pred[:, 0]
    # BUG: all pairs of the flattened batch, (16384, 16384), masked to one query afterwards
    differences = scores[:, None] - scores[None, :]
    better = tf.cast(relevance[:, None] > relevance[None, :], tf.float32)
    same_query = tf.cast(tf.equal(query[:, None], query[None, :]), tf.float32)
    pairs = better * same_query
    losses = tf.math.softplus(-differences) * pairs
    return tf.reduce_sum(losses) / tf.maximum(tf.reduce_sum(pairs), 1.0)


def make_queries(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Stands in for logged search results: relevance follows a few of the features."""
    rows = QUERIES * CANDIDATES
    features = rng.standard_normal((rows, FEATURES), dtype=np.float32)
    signal = features[:, :8] @ rng.standard_normal(8).astype(np.float32)
    relevance = np.digitize(signal + 0.5 * rng.standard_normal(rows), [-1.5, -0.5, 0.5, 1.5])
    query = np.repeat(np.arange(QUERIES), CANDIDATES)
    return features, np.stack([relevance, query], axis=1).astype(np.float32)


def make_model() -> keras.Model:
    model = keras.Sequential(
        [
            keras.Input((FEATURES,)),
            keras.layers.Dense(256, activation="relu"),
            keras.layers.Dense(128, activation="relu"),
            keras.layers.Dense(1),
        ]
    )
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss=ranknet_loss)
    return model


def main() -> None:
    keras.utils.set_random_seed(0)
    tf.ones(4).numpy()  # start TensorFlow's thread pools before the cap: their stacks count
    cap_address_space(BUDGET_BYTES)
    features, targets = make_queries(np.random.default_rng(0))
    print(f"{QUERIES} queries, {features.nbytes >> 20} MiB of features", flush=True)
    model = make_model()
    model.fit(
        features,
        targets,
        batch_size=QUERIES_PER_BATCH * CANDIDATES,
        epochs=5,
        shuffle=False,  # keep each query's candidates in one batch
        verbose=2,
    )
    print("fit finished")


if __name__ == "__main__":
    main()
