"""TensorFlow on the CPU with its BFC allocator (`TF_CPU_ALLOCATOR_USE_BFC=true`), keeping
every step's 64 MiB result, for the memory-fraction-cap fixtures.

- `TF_CPU_BFC_MEM_LIMIT_IN_MB=512` (the hit): the allocator refuses a tensor at its own
  512 MiB limit while the machine's RAM has room.
- `TF_CPU_BFC_MEM_LIMIT_IN_MB=8192 AS_BUDGET_MB=768` (the near miss): the process caps its
  own address space at 768 MiB more than it maps once TensorFlow has started, so the cap
  runs out first, far below the allocator's limit.
"""

from __future__ import annotations

import os
import resource

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf

budget_mb = int(os.environ.get("AS_BUDGET_MB", "0"))
x = tf.random.normal((4096, 4096))
(x + 1.0).numpy()  # TensorFlow's thread pools start before the cap: their stacks count
if budget_mb:
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * resource.getpagesize()
    resource.setrlimit(resource.RLIMIT_AS, (mapped + (budget_mb << 20), resource.RLIM_INFINITY))
kept = []
for step in range(200):
    kept.append(tf.matmul(x, x) + float(step))  # kept: every step's result
    print("step", step, flush=True)
