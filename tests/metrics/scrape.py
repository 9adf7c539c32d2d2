"""Scrape an exporter over HTTP and parse it with prometheus-client's own parser."""

from __future__ import annotations

import re
import subprocess
import time
import urllib.request
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

URL_LINE = re.compile(rb"memdoc: Prometheus metrics at (http://\S+)")


@dataclass(frozen=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float


def scrape(url: str) -> list[Sample]:
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return [
        Sample(s.name, dict(s.labels), s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]


def only(samples: list[Sample], name: str, **labels: str) -> Sample:
    found = [
        s
        for s in samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    ]
    assert len(found) == 1, (name, labels, found)
    return found[0]


def wait_for_url(proc: subprocess.Popen[bytes], timeout_s: float = 30.0) -> str:
    """The URL memdoc prints on stderr when it starts serving."""
    assert proc.stderr is not None
    deadline = time.monotonic() + timeout_s
    seen = b""
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        seen += line
        found = URL_LINE.search(line)
        if found:
            return found.group(1).decode()
    raise AssertionError(f"memdoc never said where it serves; its stderr was:\n{seen.decode()}")
