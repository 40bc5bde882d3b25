"""Fixtures of the plotting tests (test_plots.py, test_plots_cli.py, test_plots_page.py,
test_plots_marks.py, test_figures.py).

None is autouse: a test gets one only by naming it, and those modules close their
figures with `pytest.mark.usefixtures("close_figures")`, so no other test changes. The
plotting stack is imported inside the fixtures, so collecting the rest of the suite never
imports it.
"""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> Path:
    """A results folder of every kind of row (tests/plot_fixtures.py), one per module."""
    from tests.plot_fixtures import build_results

    return build_results(tmp_path_factory.mktemp("results"))


@pytest.fixture(scope="module")
def data(results):
    from ccbench.plots.data import load

    return load([results])


@pytest.fixture(scope="module")
def style(data):
    from ccbench.plots import cli

    return cli.make_style(data)


@pytest.fixture(scope="module")
def rendered(results, tmp_path_factory):
    """`ccbench plot` run once over the results folder: its status and output folder."""
    from ccbench.plots import cli

    out = tmp_path_factory.mktemp("figures")
    status = cli.main([str(results), "-o", str(out), "--dpi", "60", "--format", "png"])
    return status, out


@pytest.fixture
def close_figures():
    yield
    import matplotlib.pyplot as plt

    plt.close("all")


@pytest.fixture
def switch(monkeypatch):
    """`switch(name, value)`: set a CCBENCH_* variable (None: unset it) and install the
    switches the options layer reads from the environment, as an entry point does when
    it starts (floors below it never read the environment); the switches in place before
    the test are put back after it."""
    from ccbench.benchmarks import switches
    from ccbench.kernels import switches as installed

    before = installed.current()

    def set_switch(name: str, value: str | None) -> None:
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
        switches.install()

    yield set_switch
    installed.install(before)
