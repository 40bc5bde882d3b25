"""The seeded faults (tests/seeded_faults.py) still apply to the tree: each one's text
occurs exactly once in its file and its tests exist, so running them tests something."""

from __future__ import annotations

import re

import pytest

from tests.seeded_faults import FAULTS, ROOT


@pytest.mark.parametrize("fault", FAULTS, ids=lambda f: f"{f.behaviour}-{f.path}")
def test_the_fault_applies_once_and_names_real_tests(fault):
    text = (ROOT / fault.path).read_text()
    assert text.count(fault.old) == 1, fault
    assert fault.new != fault.old
    for arg in fault.tests.split():
        if arg.endswith(".py"):
            assert (ROOT / arg).is_file(), arg


def test_every_behaviour_class_has_faults():
    behaviours = {f.behaviour for f in FAULTS}
    assert behaviours == {
        "bfp-edge",
        "rabenseifner",
        "busbw",
        "header",
        "gate",
        "breakdown",
        "feedback",
        "alternation",
        "slots",
        "torch-transport",
        "launch-check",
        "results-model",
        "gate-records",
        "osu-check",
        "device-accounting",
        "device-kernels",
        "traces",
        "floor",
        "codec_floor",
        "device-launch",
        "mpi-staging",
        "library-accounting",
        "advise-inputs",
        "advise-sizes",
        "advise-turns",
        "advise-verdict",
        "host-views",
        "collective-specs",
        "typed-rows",
        "feedback-blocks",
        "staging-bound",
        "gpu-goals",
        "variant-registry",
    }


def test_the_architecture_page_counts_the_faults_there_are():
    text = (ROOT / "docs" / "architecture.md").read_text()
    counts = [int(n) for n in re.findall(r"\((\d+) of them, C kernels rebuilt", text)]
    assert counts == [len(FAULTS)]
