"""The pytest plugin: `@pytest.mark.memdoc(...)` budgets judged with `pytest --memdoc`, on
real PyTorch, JAX and Keras code on the CPU, each inner session run in a subprocess (as a
user runs pytest). The inner sessions are few and shared: framework imports take seconds."""

from __future__ import annotations

import json
import stat

import pytest

from memdoc.budget.testing import Limits, Measured, judge, measure, parse_limits
from memdoc.integrations.pytest_plugin import safe_name
from memdoc.trace.model import Header, SeriesKey
from memdoc.trace.reader import Trace, load_trace
from memdoc.units import MiB
from tests.conftest import run_memdoc

pytest_plugins = ["pytester"]

# The inner sessions: no parallel workers, in file order, with the plugin memdoc installs.
INNER = ("-p", "no:xdist", "-p", "no:randomly", "-p", "no:cacheprovider")
TIMEOUT_S = 300

TORCH_TESTS = """
import pytest
import torch


def train(steps=30, leak=False):
    torch.manual_seed(0)
    model = torch.nn.Linear(256, 256)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    kept = []
    for _ in range(steps):
        loss = model(torch.randn(64, 256)).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if leak:
            kept.append(torch.randn(1024, 512))  # 2 MiB a step, kept
    return kept


def train_mlp(steps=20):
    model = torch.nn.Sequential(
        torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 512)
    )
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(steps):
        loss = model(torch.randn(256, 512)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


def activations(rows):
    # rows x 4096 float32, twice (the input and its relu): 8192 rows are 2 x 128 MiB, which
    # glibc maps and unmaps whole, so the host counts them to the page.
    x = torch.randn(rows, 4096)
    return float(torch.relu(x).sum())


def test_warm_up():  # unmarked: torch's one-time setup is no test's budget
    train(steps=3)
    train_mlp(steps=3)
    activations(1024)


@pytest.mark.memdoc(growth_per_step="0 B")
def test_leaks():
    train(leak=True)


@pytest.mark.memdoc(growth_per_step="0 B")
def test_does_not_leak():
    train()


# The within-budget test, 20 times over: no run may fail on the host's noise.
@pytest.mark.parametrize("run", range(20))
@pytest.mark.memdoc(peak="64 MiB", growth_per_step="0 B")
def test_within_budget(run):
    train_mlp()


@pytest.mark.memdoc(peak="1.5 gigs")
def test_bad_argument():
    pass
"""

# The peak budget is set at 5% over what the first session measured for 8192 rows.
PEAK_TESTS = """
import pytest
import torch

BUDGET = {budget!r}


def activations(rows):
    # rows x 4096 float32, twice (the input and its relu): 8192 rows are 2 x 128 MiB, which
    # glibc maps and unmaps whole, so the host counts them to the page.
    x = torch.randn(rows, 4096)
    return float(torch.relu(x).sum())


def test_warm_up():  # unmarked: torch's one-time setup is no test's budget
    activations(1024)


@pytest.mark.memdoc(peak=BUDGET)
def test_same_activations():
    activations(8192)


@pytest.mark.memdoc(peak=BUDGET)
def test_ten_percent_larger_activations():
    activations(9012)  # 10% more rows: 2 x 140.8 MiB
"""

JAX_KERAS_TESTS = """
import os

os.environ["KERAS_BACKEND"] = "tensorflow"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import jax
import jax.numpy as jnp
import keras
import numpy as np
import pytest


@jax.jit
def jax_step(w, x):
    grad = jax.grad(lambda w: ((x @ w) ** 2).mean())(w)
    return w - 0.01 * grad, x @ w


def jax_loop(leak):
    w = jnp.ones((256, 256)) / 256
    kept = []
    for i in range(30):
        w, out = jax_step(w, jnp.full((2048, 256), float(i % 3)))
        out.block_until_ready()
        if leak:
            kept.append(out)  # 2 MiB a step, kept
    return kept


class KeepOutputs(keras.callbacks.Callback):
    def __init__(self, keep):
        super().__init__()
        self.keep = keep
        self.sample = np.ones((2048, 256), np.float32)
        self.kept = []

    def on_train_batch_end(self, batch, logs=None):
        out = self.model(self.sample, training=False)  # 2 MiB of outputs
        if self.keep:
            self.kept.append(out)


def keras_fit(keep):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((256,)), keras.layers.Dense(256)])
    model.compile(optimizer="sgd", loss="mse")
    x = np.ones((30 * 32, 256), np.float32)
    model.fit(x, x, batch_size=32, epochs=1, verbose=0, callbacks=[KeepOutputs(keep)])


def test_warm_up():
    jax_loop(False)
    keras_fit(False)


@pytest.mark.memdoc(growth_per_step="0 B")
def test_jax_leaks():
    jax_loop(True)


@pytest.mark.memdoc(growth_per_step="0 B")
def test_jax_does_not_leak():
    jax_loop(False)


# TensorFlow's eager calls from a callback leave freed temporaries in the C heap (once
# 13.9 MiB over 27 steps that kept nothing); returned before each step's reading, a
# callback that keeps nothing holds to a budget of 0 B.
@pytest.mark.memdoc(growth_per_step="0 B")
def test_keras_callback_keeps_outputs():
    keras_fit(True)


@pytest.mark.memdoc(growth_per_step="0 B")
def test_keras_callback_keeps_nothing():
    keras_fit(False)
"""

PLAIN_TESTS = """
import pytest


@pytest.mark.memdoc(peak="0 B")
def test_needs_64_mib():
    data = b"x" * (64 << 20)
    assert len(data) == 64 << 20
"""


def _inner(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess(*INNER, "-rA", *args, timeout=TIMEOUT_S)


def _outcomes(result: pytest.RunResult) -> dict[str, str]:
    """{test name: PASSED/FAILED/...} from the `-rA` short summary."""
    found: dict[str, str] = {}
    for line in result.outlines:
        word, _, rest = line.partition(" ")
        if word in ("PASSED", "FAILED", "ERROR", "SKIPPED") and "::" in rest:
            found[rest.split("::", 1)[1].split(" ", 1)[0]] = word
    return found


def _failure(result: pytest.RunResult, test: str) -> str:
    """The failure section of one test in the inner session's report."""
    text = result.stdout.str()
    start = text.find(f"_ {test} _")
    assert start >= 0, text
    ends = [text.find(mark, start + len(test) + 4) for mark in ("\n___", "\n---", "\n===")]
    return text[start : min(i for i in ends if i > 0)]


def test_a_torch_leak_fails_its_growth_budget_with_the_diagnosis_and_nothing_else_fails(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_torch_budgets=TORCH_TESTS)
    keep = pytester.path / "keep"

    result = _inner(pytester, "--memdoc", "--memdoc-dir", str(keep))

    outcomes = _outcomes(result)
    assert outcomes.pop("test_leaks") == "FAILED", result.stdout.str()
    assert outcomes.pop("test_bad_argument") == "FAILED"
    # The loop without the leak and the within-budget test run 20 times: no false failure.
    assert set(outcomes.values()) == {"PASSED"} and len(outcomes) == 22, outcomes
    leak = _failure(result, "test_leaks")
    assert "memdoc: growth_per_step" in leak and "over a budget of 0 B" in leak
    assert "where: host, the program's own memory" in leak and "30 steps counted" in leak
    assert "why: Memory kept alive step after step" in leak and "fix: " in leak
    trace = keep / f"{safe_name('test_torch_budgets.py::test_leaks')}.memdoc"
    assert f"trace: {trace}" in leak
    bad = _failure(result, "test_bad_argument").strip().splitlines()
    assert bad[1:] == [
        'memdoc marker: peak=\'1.5 gigs\' is not a size (try "1.5 GiB", "64MiB" or bytes)'
    ], bad
    # The summary: every budgeted test's figures and verdict.
    result.stdout.fnmatch_lines(
        [
            "*- memdoc budgets -*",
            "test*where*peak*peak held*growth/step*steps*verdict",
            "test_torch_budgets.py::test_leaks*host*30*over: growth_per_step",
            "test_torch_budgets.py::test_does_not_leak*host*30*ok",
        ]
    )
    # The kept trace and figures, and `memdoc diagnose` reads the trace.
    baseline = json.loads(trace.with_name(trace.stem + ".baseline.json").read_text())
    assert baseline["memdoc_baseline"] == 1 and "host" in baseline["places"]
    assert "leak-across-steps" in [f["rule"] for f in baseline["findings"]]
    assert len(list(keep.glob("*.memdoc"))) == 22  # every budgeted test that ran
    diagnosed = run_memdoc("diagnose", str(trace))
    assert b"Memory kept alive step after step" in diagnosed.stdout, diagnosed


def test_a_peak_budget_5_percent_over_the_measured_peak_passes_and_10_percent_more_fails(
    pytester: pytest.Pytester,
) -> None:
    # The base: what 8192 rows need, measured as the budget measures it, in a first session.
    pytester.makepyfile(test_peaks=PEAK_TESTS.format(budget="100 GiB"))
    keep = pytester.path / "base"
    based = _inner(pytester, "--memdoc", "--memdoc-dir", str(keep), "-k", "warm or same")
    assert based.ret == 0, based.stdout.str()
    trace = keep / f"{safe_name('test_peaks.py::test_same_activations')}.memdoc"
    base = measure(load_trace(trace)).peak
    assert base is not None and 250 * MiB < base < 300 * MiB, base
    # 5% over the base: the same activations pass (within 5% plus the host's 2% tolerance);
    # 10% more rows need 28 MiB more, over the budget and its tolerance by some 8 MiB.
    budget = round(base * 1.05)
    pytester.makepyfile(test_peaks=PEAK_TESTS.format(budget=budget))

    result = _inner(pytester, "--memdoc")

    outcomes = _outcomes(result)
    assert outcomes == {
        "test_warm_up": "PASSED",
        "test_same_activations": "PASSED",
        "test_ten_percent_larger_activations": "FAILED",
    }, result.stdout.str()
    larger = _failure(result, "test_ten_percent_larger_activations")
    assert "memdoc: peak " in larger and "held when the test began, budget " in larger, larger
    assert "where: host, the program's own memory" in larger


def test_a_jax_leak_and_a_keras_callback_that_keeps_outputs_fail_their_growth_budget(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_jax_keras=JAX_KERAS_TESTS)

    result = _inner(pytester, "--memdoc")

    assert _outcomes(result) == {
        "test_warm_up": "PASSED",
        "test_jax_leaks": "FAILED",
        "test_jax_does_not_leak": "PASSED",
        "test_keras_callback_keeps_outputs": "FAILED",
        "test_keras_callback_keeps_nothing": "PASSED",
    }, result.stdout.str()
    for test, budget in (
        ("test_jax_leaks", "0 B"),
        ("test_keras_callback_keeps_outputs", "0 B"),
    ):
        failed = _failure(result, test)
        assert "memdoc: growth_per_step" in failed, failed
        assert f"over a budget of {budget}" in failed, failed
        assert "why: Memory kept alive step after step" in failed, failed


def test_without_memdoc_the_marker_is_registered_and_does_nothing(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_plain=PLAIN_TESTS)

    result = _inner(pytester, "--strict-markers")

    assert _outcomes(result) == {"test_needs_64_mib": "PASSED"}, result.stdout.str()
    assert "memdoc budgets" not in result.stdout.str()


def test_a_trace_memdoc_cannot_write_is_a_warning_and_the_test_passes(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_plain=PLAIN_TESTS)
    folder = pytester.path / "read-only"
    # Where the trace goes, a folder: no one can write it, root included; and the folder
    # read-only, for everyone else.
    (folder / f"{safe_name('test_plain.py::test_needs_64_mib')}.memdoc").mkdir(parents=True)
    folder.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        result = _inner(pytester, "--memdoc", "--memdoc-dir", str(folder))
    finally:
        folder.chmod(stat.S_IRWXU)

    assert _outcomes(result) == {"test_needs_64_mib": "PASSED"}, result.stdout.str()
    result.stdout.fnmatch_lines(["*MemdocWarning: memdoc cannot record test_plain.py::*"])


# -- the measuring, on traces made by hand -------------------------------------------------


def _trace(values: dict[SeriesKey, list[tuple[float, float]]], steps: list[float]) -> Trace:
    from memdoc.trace.model import Event, EventKind

    trace = Trace(Header(version=1, created_unix=0.0, memdoc_version="", mode="watch"))
    for key, points in values.items():
        for t, value in points:
            trace.add_values(t, [(key, value)])
    for number, t in enumerate(steps, start=1):
        trace.add_event(Event(t=t, kind=EventKind.STEP, data={"step": number}))
    return trace


def test_on_a_gpu_the_peak_is_the_allocator_s_over_its_start_not_earlier_tests_peak() -> None:
    allocated = SeriesKey("torch.allocated", 0, 1)
    peaks = SeriesKey("torch.allocated_peak", 0, 1)
    reserved = SeriesKey("torch.reserved", 0, 1)
    # An earlier test peaked at 9 GiB: the first interval peak (the all-time one) says so.
    trace = _trace(
        {
            allocated: [(0.0, 1000 * MiB), (1.0, 1100 * MiB), (2.0, 1000 * MiB)],
            peaks: [(0.0, 9000 * MiB), (1.0, 1500 * MiB), (2.0, 1100 * MiB)],
            reserved: [(0.0, 2000 * MiB), (1.0, 2000 * MiB), (2.0, 2000 * MiB)],
        },
        steps=[],
    )

    measured = measure(trace)

    assert (measured.place, measured.exact) == ("gpu0", True)
    assert measured.used_words == "PyTorch allocated"
    assert measured.peak == 500 * MiB and measured.peak_held == 0
    # Exact: one byte over fails; the budget itself passes.
    assert judge(measured, Limits(peak=500 * MiB)).passed
    over = judge(measured, Limits(peak=500 * MiB - 1))
    assert [e.figure for e in over.over] == ["peak"]
    assert "over the 1000.0 MiB held when the test began" in over.over[0].line


def test_growth_needs_three_steps_after_warm_up() -> None:
    anon = SeriesKey("host.anon")
    trace = _trace(
        {anon: [(t / 10, 100 * MiB + t * MiB) for t in range(60)]}, steps=[0.5, 1.5, 2.5, 3.5]
    )

    measured = measure(trace, warmup=2)
    verdict = judge(measured, Limits(growth_per_step=0, warmup=2))

    assert measured.growth_steps == 2
    assert [e.line for e in verdict.over] == ["too few steps to judge growth (2)"]


@pytest.mark.parametrize(
    ("args", "kwargs", "error"),
    [
        ((), {"peak": "lots"}, "memdoc marker: peak='lots' is not a size"),
        ((), {"growth_per_step": -1}, "memdoc marker: growth_per_step=-1 is not a size"),
        ((), {"warmup": "2"}, "memdoc marker: warmup='2' is not a number of steps"),
        ((), {"tolerance": "five"}, "memdoc marker: tolerance='five' is not a size or a share"),
        ((), {"peek": "1 GiB"}, "memdoc marker: no argument called 'peek'"),
        (("1 GiB",), {"peak": "1 GiB"}, "memdoc marker: peak given twice"),
    ],
)
def test_a_bad_marker_argument_is_named_in_one_line(
    args: tuple[object, ...], kwargs: dict[str, object], error: str
) -> None:
    with pytest.raises(ValueError) as raised:
        parse_limits(args, kwargs)
    assert str(raised.value).startswith(error) and "\n" not in str(raised.value)


def test_marker_sizes_and_tolerances() -> None:
    limits = parse_limits(("1.5 GiB",), {"growth_per_step": 0, "tolerance": "5%", "warmup": 0})

    assert limits.peak == 1536 * MiB and limits.growth_per_step == 0 and limits.warmup == 0
    assert limits.tolerance is not None and limits.tolerance.share == 0.05
    assert parse_limits((), {"peak_held": "64MiB"}).peak_held == 64 * MiB
    host = Measured("host", "host", "own", "rss", exact=False, used_start=0, used_top=101 * MiB)
    # The host's default tolerance: max(1 MiB, 2% of the budget).
    assert judge(host, Limits(peak=100 * MiB)).passed
    assert not judge(host, Limits(peak=98 * MiB)).passed
    exact = parse_limits((), {"tolerance": "0 B"}).tolerance
    assert not judge(host, Limits(peak=100 * MiB, tolerance=exact)).passed


def test_safe_names_are_file_names() -> None:
    assert safe_name("tests/test_x.py::test_y[3-a b]") == "tests_test_x.py_test_y_3-a_b"
    long = safe_name("t.py::test_" + "x" * 300)
    assert len(long) <= 120 and long != safe_name("t.py::test_" + "x" * 299)


def test_without_memdoc_turned_on_pytest_imports_nothing_of_memdoc(
    pytester: pytest.Pytester,
) -> None:
    # The entry point is loaded in every pytest run wherever memdoc is installed, and
    # `import memdoc` watches the frameworks' loops: a suite that did not ask must not get it.
    pytester.makepyfile(
        """
        import sys

        def test_nothing_of_memdoc():
            loaded = sorted(m for m in sys.modules if m == "memdoc" or m.startswith("memdoc."))
            assert not loaded, loaded
        """
    )
    result = pytester.runpytest_subprocess(
        "-p", "no:randomly", "-p", "no:xdist", "-p", "no:cacheprovider"
    )
    result.assert_outcomes(passed=1)
