"""The Prometheus collector: metric families built from a snapshot at scrape time."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from memdoc.metrics.identity import JobIdentity
from memdoc.metrics.snapshot import PROCESS_TERMS, MetricsSnapshot
from memdoc.version import __version__

# Labels every series carries, so that one Prometheus query can tell nodes and ranks apart.
JOB_LABELS = ("host", "job", "node_rank", "rank", "local_rank")
PROCESS_LABELS = ("host", "job", "node_rank", "device", "pid", "rank", "local_rank", "ours")


class SnapshotSource(Protocol):
    """Where the exporter gets the state it shows; called on the scrape's own thread."""

    def snapshot(self) -> MetricsSnapshot | None: ...


class MemdocCollector(Collector):
    """Builds every family when scraped, from the source's state at that moment: nothing is
    computed between scrapes, and the sampler never waits for an exporter."""

    def __init__(self, source: SnapshotSource, identity: JobIdentity) -> None:
        self._source = source
        self._identity = identity

    def collect(self) -> Iterator[Metric]:
        snap = self._source.snapshot()
        yield from _identity_families(self._identity, snap)
        if snap is not None:
            job = _job_values(self._identity)
            yield from _device_families(job, snap)
            yield from _process_families(self._identity, snap)
            yield from _host_families(job, snap)
            yield from _progress_families(job, snap)
            yield from _forecast_families(job, snap)

    def describe(self) -> Iterator[Metric]:
        return iter(())  # families depend on what was recorded: nothing to pre-register


def _job_values(identity: JobIdentity) -> list[str]:
    return [
        identity.host,
        identity.job or "",
        _text(identity.node_rank),
        _text(identity.rank),
        _text(identity.local_rank),
    ]


def _text(value: int | None) -> str:
    return "" if value is None else str(value)


def _identity_families(identity: JobIdentity, snap: MetricsSnapshot | None) -> Iterator[Metric]:
    job = _job_values(identity)
    info = InfoMetricFamily("memdoc", "memdoc's version, and the job it watches", labels=JOB_LABELS)
    info.add_metric(job, {"version": __version__})
    yield info
    up = GaugeMetricFamily(
        "memdoc_running",
        "1 while the watched program runs, 0 once it ended",
        labels=JOB_LABELS,
    )
    up.add_metric(job, 1.0 if snap is not None and snap.running else 0.0)
    yield up


def _device_families(job: list[str], snap: MetricsSnapshot) -> Iterator[Metric]:
    ledger = GaugeMetricFamily(
        "memdoc_device_memory_bytes",
        "One device's memory ledger: terms that add up to the device total (term: allocated, "
        "cached_free, reserved, process_other, other_processes, free, unexplained)",
        labels=(*JOB_LABELS, "device", "term", "framework"),
    )
    total = GaugeMetricFamily(
        "memdoc_device_total_bytes",
        "A device's total memory, as the driver reports it",
        labels=(*JOB_LABELS, "device"),
    )
    for device in snap.devices:
        index = str(device.device)
        for term in device.terms:
            ledger.add_metric([*job, index, term.key, term.framework or ""], float(term.bytes))
        if device.total_bytes is not None:
            total.add_metric([*job, index], float(device.total_bytes))
    yield ledger
    yield total


def _process_families(identity: JobIdentity, snap: MetricsSnapshot) -> Iterator[Metric]:
    used = GaugeMetricFamily(
        "memdoc_process_gpu_used_bytes",
        "GPU memory of one process on one device, as the driver reports it",
        labels=PROCESS_LABELS,
    )
    terms = GaugeMetricFamily(
        "memdoc_process_memory_bytes",
        "One process's own ledger on a device (term: allocated, cached_free, reserved, "
        "process_other = CUDA context and other allocators)",
        labels=(*PROCESS_LABELS, "term", "framework"),
    )
    for proc in snap.processes:
        labels = [
            identity.host,
            identity.job or "",
            _text(identity.node_rank),
            str(proc.device),
            str(proc.pid),
            _text(proc.rank),
            _text(proc.local_rank),
            "true" if proc.ours else "false",
        ]
        if proc.gpu_used_bytes is not None:
            used.add_metric(labels, float(proc.gpu_used_bytes))
        for term in proc.ledger.terms:
            if term.key in PROCESS_TERMS:
                terms.add_metric([*labels, term.key, term.framework or ""], float(term.bytes))
    yield used
    yield terms


def _host_families(job: list[str], snap: MetricsSnapshot) -> Iterator[Metric]:
    yield from _gauge(
        "memdoc_host_rss_bytes",
        "Resident memory of the watched process tree on the host",
        job,
        snap.host_rss_bytes,
    )
    per_process = GaugeMetricFamily(
        "memdoc_process_host_rss_bytes",
        "Resident host memory of one process",
        labels=(*JOB_LABELS, "pid"),
    )
    for pid, rss in snap.host_process_rss_bytes:
        per_process.add_metric([*job, str(pid)], float(rss))
    yield per_process
    limits = GaugeMetricFamily(
        "memdoc_host_limit_bytes",
        "What host memory may reach (kind: cgroup = the container's limit, ram = the "
        "machine's memory, rlimit_as = the lowest address-space cap of a process)",
        labels=(*JOB_LABELS, "kind"),
    )
    for kind, value in snap.host_limits_bytes:
        limits.add_metric([*job, kind], float(value))
    yield limits
    yield from _gauge(
        "memdoc_host_available_bytes",
        "Memory the host can still give without swapping",
        job,
        snap.host_available_bytes,
    )


def _progress_families(job: list[str], snap: MetricsSnapshot) -> Iterator[Metric]:
    steps = CounterMetricFamily(
        "memdoc_steps", "Training steps seen (optimizer steps or memdoc.step())", labels=JOB_LABELS
    )
    steps.add_metric(job, float(snap.steps))
    yield steps
    yield from _gauge(
        "memdoc_step_rate_per_second",
        "Steps per second over the last minute",
        job,
        snap.step_rate_per_s,
    )
    ooms = CounterMetricFamily(
        "memdoc_ooms", "Memory errors recorded (GPU, host, disguised)", labels=JOB_LABELS
    )
    ooms.add_metric(job, float(snap.ooms))
    yield ooms
    top = InfoMetricFamily(
        "memdoc_top_finding",
        "The most confident diagnosis right now (rule slug, code, confidence word)",
        labels=JOB_LABELS,
    )
    confidence = GaugeMetricFamily(
        "memdoc_top_finding_confidence",
        "How sure the top diagnosis is, 0 to 1 (for alerts: >= 0.7 is 'strong')",
        labels=(*JOB_LABELS, "rule", "code"),
    )
    if snap.top_finding is not None:
        found = snap.top_finding
        confidence.add_metric([*job, found.rule, found.code], found.confidence)
        top.add_metric(
            job,
            {
                "rule": found.rule,
                "code": found.code,
                "confidence": found.word,
                "title": found.title,
            },
        )
    yield top
    yield confidence


def _forecast_families(job: list[str], snap: MetricsSnapshot) -> Iterator[Metric]:
    labels = (*JOB_LABELS, "limit", "device")
    steps = GaugeMetricFamily(
        "memdoc_forecast_steps_left",
        "Steps until the per-step peak reaches the limit at the growth seen so far (limit: "
        "which one, in words); absent when no OOM is forecast or the run ended",
        labels=labels,
    )
    seconds = GaugeMetricFamily(
        "memdoc_forecast_seconds_left",
        "Seconds until the forecast OOM at the steps' pace, counted from the scrape",
        labels=labels,
    )
    limit = GaugeMetricFamily(
        "memdoc_forecast_limit_bytes", "The limit the forecast OOM runs into", labels=labels
    )
    said = snap.forecast
    if said is not None:
        where = [*job, said.limit, _text(said.device)]
        steps.add_metric(where, float(said.steps_left))
        limit.add_metric(where, float(said.limit_bytes))
        if said.seconds_left is not None:
            seconds.add_metric(where, said.seconds_left)
    yield steps
    yield seconds
    yield limit


def _gauge(name: str, documentation: str, job: list[str], value: float | None) -> Iterator[Metric]:
    family = GaugeMetricFamily(name, documentation, labels=JOB_LABELS)
    if value is not None:
        family.add_metric(job, float(value))
    yield family
