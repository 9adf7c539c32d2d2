"""`memdoc rules`: the catalogue of root causes, and each one's documentation."""

from __future__ import annotations

import argparse
import sys

from memdoc.errors import MemdocError

NAME = "rules"
HELP = "list the root causes memdoc knows, or print one's documentation"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "slug", nargs="?", metavar="SLUG", help="a rule's slug (or code, e.g. MD001) to document"
    )


def run(args: argparse.Namespace) -> int:
    # Imported here: every `memdoc` command builds this module's parser.
    from memdoc.rules.registry import closest_slug, get_rule

    if args.slug is None:
        print(catalogue_text())
        return 0
    rule = get_rule(args.slug)
    if rule is None:
        closest = closest_slug(args.slug)
        hint = f"did you mean {closest}? " if closest else ""
        raise MemdocError(
            f"no rule named {args.slug!r}", hint=f"{hint}`memdoc rules` lists them all"
        )
    if sys.stdout.isatty():
        from rich.console import Console
        from rich.markdown import Markdown

        Console().print(Markdown(rule.doc))
    else:
        print(rule.doc, end="")
    return 0


def catalogue_text() -> str:
    """Code, slug and title of every rule, one a line; cross-rank rules after a heading."""
    from memdoc.rules.registry import all_rules, all_run_rules

    lines = [_line(r.code, r.slug, r.title) for r in all_rules()]
    lines += ["", "Across ranks (memdoc diagnose with several traces):"]
    lines += [_line(r.code, r.slug, r.title) for r in all_run_rules()]
    lines += ["", "memdoc rules SLUG prints a rule's documentation."]
    return "\n".join(lines)


def _line(code: str, slug: str, title: str) -> str:
    return f"{code}  {slug:<28} {title}"
