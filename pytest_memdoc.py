"""The entry point of memdoc's pytest plugin (see memdoc/integrations/pytest_plugin.py).

pytest imports every installed plugin's entry point in every run. This module lives outside
the `memdoc` package so that importing it imports nothing of memdoc: `import memdoc` watches
the frameworks' training loops, which a test suite that did not ask for memdoc must not get.
It adds the `--memdoc` options and the `memdoc` marker (so that `--strict-markers` suites
keep working without memdoc turned on); memdoc itself is loaded only under `--memdoc`.
"""

from __future__ import annotations

import pytest

MARKER_HELP = (
    "memdoc(peak=None, peak_held=None, growth_per_step=None, warmup=2, tolerance=None): "
    "with --memdoc, fail the test when it needs more memory than this budget (sizes as "
    '"1.5 GiB" or bytes; tolerance as a size or a share, "5%")'
)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("memdoc", "memory budgets (memdoc)")
    group.addoption(
        "--memdoc",
        action="store_true",
        default=False,
        help="record tests marked @pytest.mark.memdoc(...) and fail those over their budget",
    )
    group.addoption(
        "--memdoc-dir",
        metavar="DIR",
        default=None,
        help="keep each budgeted test's trace (DIR/<test>.memdoc) and figures "
        "(DIR/<test>.baseline.json); without it they go to a temporary folder and are removed",
    )


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", MARKER_HELP)
    if config.getoption("memdoc", False):
        from memdoc.integrations import pytest_plugin

        if not config.pluginmanager.is_registered(pytest_plugin):
            config.pluginmanager.register(pytest_plugin, "memdoc-budgets")
