"""The command line: one module per command, wired by `memdoc.cli.main`."""
