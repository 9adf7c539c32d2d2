"""`memdoc` entry point: parse the command line, run one command, map errors to exit codes."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import resource
import signal
import sys
from collections.abc import Sequence
from typing import NoReturn

from memdoc.cli.common import Command
from memdoc.errors import MemdocError
from memdoc.printable import printable
from memdoc.version import __version__

# One module per command, in the order `memdoc --help` lists them.
COMMAND_MODULES = (
    "run",
    "headroom",
    "explain",
    "diagnose",
    "compare",
    "report",
    "live",
    "top",
    "import_",
    "rules",
    "info",
)


def _commands() -> list[Command]:
    commands: list[Command] = []
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(f"memdoc.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"memdoc.cli.{name}":
                continue  # a command not built yet
            raise
        commands.append(module)
    return commands


class _Parser(argparse.ArgumentParser):
    """argparse, whose error line quotes the arguments given: shown, never obeyed."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {printable(message)}\n")


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, Command]]:
    parser = _Parser(
        prog="memdoc",
        description="GPU memory and OOM diagnostics for PyTorch, TensorFlow/Keras and JAX.",
    )
    parser.add_argument("--version", action="version", version=f"memdoc {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    by_name: dict[str, Command] = {}
    for command in _commands():
        sub_parser = sub.add_parser(command.NAME, help=command.HELP, description=command.HELP)
        command.add_arguments(sub_parser)
        by_name[command.NAME] = command
    return parser, by_name


def main(argv: Sequence[str] | None = None) -> int:
    parser, commands = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return commands[args.command].run(args)
    except MemdocError as exc:
        print(f"memdoc: error: {printable(exc.message)}", file=sys.stderr)
        if exc.hint:
            print(f"memdoc: hint: {printable(exc.hint)}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


def entry() -> None:
    from memdoc.cli.streams import degrade_standard_streams

    degrade_standard_streams()
    status = main()
    signum = getattr(status, "signal", None)
    if signum is not None:
        die_of(signum)
    sys.exit(status)


# Signals whose default action writes a core: memdoc's own would only mislead.
_CORE_SIGNALS = frozenset(
    getattr(signal, name)
    for name in ("SIGQUIT", "SIGILL", "SIGTRAP", "SIGABRT", "SIGBUS", "SIGFPE", "SIGSEGV", "SIGSYS")
    if hasattr(signal, name)
)


def die_of(signum: int) -> NoReturn:
    """End this process by `signum`, as the program it ran ended, once all is written."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    if signum in _CORE_SIGNALS:
        with contextlib.suppress(Exception):
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    with contextlib.suppress(Exception):  # SIGKILL's and SIGSTOP's cannot be changed
        signal.signal(signum, signal.SIG_DFL)
    with contextlib.suppress(Exception):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signum})
    with contextlib.suppress(Exception):
        os.kill(os.getpid(), signum)
    # A signal whose default is to go on (SIGCHLD, SIGWINCH) or that could not be sent.
    os._exit(128 + signum)


if __name__ == "__main__":
    entry()
