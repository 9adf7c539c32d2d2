"""A plain-Python loop that keeps 2 MiB per step under `memdoc.watch`, under a memory cap.

Usage: watch_leak.py TRACE [BUDGET_MIB]. Ends with a MemoryError when the cap is reached.
"""

from __future__ import annotations

import sys
import time

from host_cap import cap_address_space, steady_malloc

import memdoc

BUDGET_MIB = int(sys.argv[2]) if len(sys.argv) > 2 else 200


def main() -> None:
    steady_malloc()
    with memdoc.watch(sys.argv[1], interval=0.05, force=True) as watched:
        cap_address_space(BUDGET_MIB << 20)
        kept: list[bytearray] = []
        for step in range(1, 100_000):
            kept.append(bytearray(2 << 20))  # the leak
            watched.step()
            print(f"step {step}", flush=True)
            time.sleep(0.02)


if __name__ == "__main__":
    main()
