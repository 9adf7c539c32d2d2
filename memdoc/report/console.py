"""The terminal console every memdoc text view prints through: nothing it shows can steer it."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from rich.console import Console, ConsoleOptions, RenderableType
from rich.segment import Segment

from memdoc.printable import printable


class SafeConsole(Console):
    """A rich console that shows every character of the content, never obeys one.

    Styles are rich's own and stay; text that came from a trace, a log or an error (an
    escape sequence, a clipboard write, a bell, undecodable bytes) is shown as escapes.
    Markup in plain strings is not interpreted: memdoc styles with `Text` objects.
    """

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("markup", False)
        kwargs.setdefault("emoji", False)
        kwargs.setdefault("highlight", False)
        if kwargs.get("file") is not None:
            # A console given a file writes to it, in a notebook too (where rich would
            # otherwise send each print to the front end as an output of its own).
            kwargs.setdefault("force_jupyter", False)
        super().__init__(**kwargs)

    def render(
        self, renderable: RenderableType, options: ConsoleOptions | None = None
    ) -> Iterable[Segment]:
        for segment in super().render(renderable, options):
            if segment.control or not segment.text:
                yield segment
                continue
            shown = printable(segment.text, keep_lines=True)
            yield segment if shown == segment.text else Segment(shown, segment.style)
