"""What one concern of host-oom concludes: how sure, in a sentence, and how to confirm it."""

from __future__ import annotations

from dataclasses import dataclass

from memdoc.rules.confidence import Signals


@dataclass(frozen=True)
class Verdict:
    """How sure a concern is, its summary, and what would confirm it when it is unsure."""

    signals: Signals
    summary: str
    to_confirm: str | None = None
    title: str | None = None  # where the rule's title would say more than happened
