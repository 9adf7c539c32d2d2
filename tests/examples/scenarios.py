"""The example scenarios as their READMEs declare them: script, rule that must fire, needs."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parent.parent.parent / "examples"
_RULE = re.compile(r"^Rule: `([a-z0-9-]+)`\s*$", re.MULTILINE)
_CPU = re.compile(r"^Runs on CPU: (yes|no)\b", re.MULTILINE)
_NEEDS = re.compile(r"^Needs: (.+)$", re.MULTILINE)


class ScenarioError(ValueError):
    """An example folder whose README lacks one of the fixed lines."""


@dataclass(frozen=True)
class Scenario:
    """One example folder: the script to run and what memdoc must say about it."""

    name: str
    script: Path
    rule: str  # the slug that must be the first finding
    on_cpu: bool
    needs: tuple[str, ...]  # Python modules the script imports ("torch", "jax", ...)

    @property
    def folder(self) -> Path:
        return self.script.parent


def load_scenario(folder: Path) -> Scenario:
    """Read a folder's README fixed lines and find its one script.

    Raises:
        ScenarioError: the README is missing a fixed line, or the folder has not exactly
            one script.
    """
    text = (folder / "README.md").read_text(encoding="utf-8")
    rule, cpu, needs = _RULE.search(text), _CPU.search(text), _NEEDS.search(text)
    if rule is None or cpu is None or needs is None:
        raise ScenarioError(f"{folder.name}/README.md lacks a Rule:, Runs on CPU: or Needs: line")
    scripts = sorted(folder.glob("*.py"))
    if len(scripts) != 1:
        raise ScenarioError(f"{folder.name} has {len(scripts)} scripts, not one")
    return Scenario(
        name=folder.name,
        script=scripts[0],
        rule=rule.group(1),
        on_cpu=cpu.group(1) == "yes",
        needs=tuple(module.strip() for module in needs.group(1).split(",")),
    )


def all_scenarios(examples: Path = EXAMPLES) -> list[Scenario]:
    """Every example folder, by name."""
    return [load_scenario(folder) for folder in sorted(examples.iterdir()) if folder.is_dir()]
