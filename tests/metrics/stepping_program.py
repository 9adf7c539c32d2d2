"""A CPU program that steps and grows its memory until told to stop (a file appears)."""

import os
import sys
import time

import memdoc

stop_file = sys.argv[1]
hoard = []
while not os.path.exists(stop_file):
    hoard.append(bytearray(1_000_000))
    memdoc.step()
    time.sleep(0.05)
print(f"steps {len(hoard)}")
