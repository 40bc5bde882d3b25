"""Fixtures shared by test modules: the plotting tests' (test_plots.py, test_plots_cli.py,
test_plots_page.py, test_plots_marks.py, test_figures.py), `fresh_counts` (the device
double's counts zeroed around each test of the modules on the double) and `clone` (a
throw-away clone of this checkout: the gate's and compare's tests).

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


@pytest.fixture
def fresh_counts():
    """The device double's counts zeroed, and outside a timed region, around a test; the
    modules on the double use it throughout
    (`pytestmark = [..., pytest.mark.usefixtures("fresh_counts")]`)."""
    import tests.devicedouble as double

    double.STATS.reset()
    yield
    double.STATS.in_region = False
    double.STATS.reset()


@pytest.fixture
def clone(tmp_path) -> Path:
    """A clone of this checkout's HEAD, with an identity to commit as (the gate's tests
    commit their changes, as a contributor would)."""
    import subprocess

    from tests.helpers.repo import git
    from tests.mpirun import REPO

    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    path = tmp_path / "clone"
    subprocess.run(["git", "clone", "--quiet", str(REPO), str(path)], check=True)
    git(path, "config", "user.email", "ci@example.invalid")
    git(path, "config", "user.name", "ccbench tests")
    return path
