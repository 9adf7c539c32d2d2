"""The concerns host-oom weighs, one module each: the kill, shared memory, a failed allocation."""
