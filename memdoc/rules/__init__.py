"""Root-cause rules: the catalogue, the engine that runs it, and the Finding it reports."""
