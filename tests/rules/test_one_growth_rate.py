"""One growth rate per run: the finding, the per-step table and the forecast agree, read
from the memory the program owns, not from file pages that RSS also counts.

The fixtures are real PyTorch runs of tests/rules/programs/torch_mapped_dataset.py: a loop
that reads its dataset through a memory map, 4 MiB of new file pages a step, with and
without a 3 MiB-a-step leak of its own."""

from __future__ import annotations

from memdoc.forecast import Forecast, NoForecast, assess
from memdoc.report.timeline import step_tables
from memdoc.rules.engine import diagnose
from memdoc.trace import Metric, load_trace
from memdoc.units import MiB
from tests.rules.fixture_cases import RULE_FIXTURES

FOLDER = RULE_FIXTURES / "leak-across-steps"


def test_the_leak_is_measured_at_its_true_rate_and_quoted_alike_by_finding_and_table() -> None:
    trace = load_trace(FOLDER / "hit-leak-beside-mapped-reads.memdoc")
    leak = next(f for f in diagnose(trace) if f.rule == "leak-across-steps")
    quoted = next(e.value for e in leak.evidence if e.text.startswith("growth per step"))
    assert quoted is not None
    assert abs(quoted - 3 * MiB) < 0.1 * MiB  # the program keeps 3 MiB a step
    (table,) = step_tables(trace)
    assert table.metric == Metric.HOST_ANON
    assert table.growth_bytes_per_step == quoted
    said = assess(trace)  # the forecast reads the same memory, peaks at each step
    assert isinstance(said, Forecast) and said.metric == Metric.HOST_ANON
    assert abs(said.growth_bytes_per_step - quoted) < 0.05 * quoted
    # RSS, which also counts the 4 MiB of file pages read each step, would say 7 MiB.
    rss = trace.per_step(Metric.HOST_RSS)
    assert rss[-1].baseline is not None and rss[10].baseline is not None
    assert (rss[-1].baseline - rss[10].baseline) / (len(rss) - 11) > 6 * MiB


def test_reading_a_memory_mapped_dataset_is_no_leak_and_the_table_shows_no_growth() -> None:
    trace = load_trace(FOLDER / "miss-mapped-dataset-reads.memdoc")
    assert "leak-across-steps" not in {f.rule for f in diagnose(trace)}
    (table,) = step_tables(trace)
    assert table.growth_bytes_per_step is not None
    assert abs(table.growth_bytes_per_step) < 0.2 * MiB
    assert isinstance(assess(trace), NoForecast)
