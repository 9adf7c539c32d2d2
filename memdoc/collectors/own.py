"""This process's own memory, read in-process in a few microseconds (Linux `/proc/self`)."""

from __future__ import annotations


def own_memory() -> dict[str, int]:
    """Resident bytes and address space in use of this process now; empty where
    `/proc/self/statm` cannot be read (not Linux, or failing at an OOM)."""
    try:
        import resource

        with open("/proc/self/statm") as statm:
            pages = statm.read().split()
        page = resource.getpagesize()
        return {
            "address_space_bytes": int(pages[0]) * page,
            "rss_bytes": int(pages[1]) * page,
        }
    except (OSError, ValueError, IndexError, ImportError):
        return {}
