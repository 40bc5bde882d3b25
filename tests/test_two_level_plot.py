"""The two-level figure's points and notes on constructed rows worked by hand (2 nodes x
2 ranks, 16 MiB, 1 Gbit/s; plots/two_level.py), and the sweep key that builds the
cluster of nodes (sweeps/two-level.toml)."""

import pandas as pd
import pytest

from ccbench.kernels.errors import UsageError
from ccbench.plots import two_level
from ccbench.plots.style import Style
from ccbench.scripts.sweeps.tasks import load_spec

S = 16 << 20
CODEC = "bfp:rate=8"
FLAT = f"coll_compressed --codec {CODEC}"
NODE = f"{FLAT} --hierarchy node"
LEADER = f"{FLAT} --hierarchy leader"


class Rows:
    def __init__(self, **frames):
        self.frames = frames

    def get(self, kind):
        return self.frames.get(kind, pd.DataFrame())


def level_row(collective, algorithm, floor_us, timestamp="2026-01-01T00:00:00"):
    return {
        "variant": "coll_compressed",
        "algorithm": algorithm,
        "collective": collective,
        "codec": CODEC,
        "ranks": 4,
        "size_bytes": S,
        "link_gbps": 1.0,
        "floor_link_gbps": 1.0,
        "link_step_us": 1000.0,
        "link_burst_bytes": 0.0,
        "floor_us": floor_us,
        "timestamp": timestamp,
    }


def compare_row(collective, a, ratio, low, high, verdict, timestamp="2026-01-01T01:00:00"):
    return {
        "a": a,
        "b": NODE,
        "collective": collective,
        "ranks": 4,
        "size_bytes": S,
        "link_gbps": 1.0,
        "ratio": ratio,
        "ratio_low": low,
        "ratio_high": high,
        "verdict": verdict,
        "load_start": 13.9,
        "load_end": 18.0,
        "timestamp": timestamp,
    }


@pytest.fixture
def data():
    harness = [
        level_row("allgather", "ring", 113700.0),
        level_row("allgather", "hierarchical-ring", 79100.0),
        # an older hierarchical row: the newest one counts
        level_row("allgather", "hierarchical-ring", 1.0, "2025-01-01T00:00:00"),
        level_row("reduce_scatter", "ring", 35300.0),
        level_row("reduce_scatter", "hierarchical-ring", 21500.0),
        level_row("reduce_scatter", "leaders-ring", 23650.0),
    ]
    compare = [
        compare_row("allgather", FLAT, 1.064, 0.892, 1.268, "no difference"),
        compare_row("allgather", "baseline --algorithm mpi", 0.329, 0.315, 0.344, "faster"),
        compare_row("reduce_scatter", FLAT, 0.991, 0.932, 1.054, "no difference"),
        # not a two-level pair: left out
        compare_row("allgather", f"p2p_compressed --codec {CODEC}", 0.5, 0.4, 0.6, "faster"),
    ]
    compare[-1]["b"] = FLAT
    # the designs against each other: B through leaders, A per local rank
    compare.append(compare_row("reduce_scatter", NODE, 1.294, 1.236, 1.354, "slower"))
    compare[-1]["b"] = LEADER
    # inside the node: shared memory (B) over MPI's messages (A), both per local rank
    compare.append(
        compare_row("allgather", f"{NODE} --intra-node ring", 0.956, 0.936, 0.977, "faster")
    )
    compare[-1]["b"] = f"{NODE} --intra-node shm"
    return Rows(harness=pd.DataFrame(harness), compare=pd.DataFrame(compare))


def test_points_and_their_expected_figures(data):
    points = {(p.collective, p.against): p for p in two_level.two_level_points(data)}
    assert set(points) == {
        ("allgather", "flat"),
        ("allgather", "library"),
        ("reduce_scatter", "flat"),
        ("reduce_scatter", "per-rank"),
        ("allgather", "ring"),
    }
    # levels in series on both sides: one floor, however the node moves its bytes
    assert points["allgather", "ring"].expected == 1.0
    assert points["allgather", "flat"].expected == pytest.approx(79100 / 113700)
    assert points["reduce_scatter", "per-rank"].expected == pytest.approx(23650 / 21500)
    assert points["reduce_scatter", "flat"].expected == pytest.approx(21500 / 35300)
    # the library's flat floor on the hierarchical row's link: 3 x 16 MiB at 1 Gbit/s
    # (402.653184 ms) + log2(4) = 2 steps of 1 ms
    assert points["allgather", "library"].expected == pytest.approx(79.1 / 404.653184)
    assert points["allgather", "library"].ratio == 0.329


def test_shared_memory_beside_the_level_across_expects_the_larger_level(data):
    # the hierarchical allgather row ran its levels overlapped: floor = the larger level,
    # 68.9 ms across; MPI's messages inside the node run them in series, 4.9 + 68.9 ms
    harness = data.get("harness").copy()
    hier = harness["algorithm"] == "hierarchical-ring"
    newest = hier & (harness["collective"] == "allgather") & (harness["floor_us"] > 1)
    harness.loc[newest, ["floor_us", "intra_floor_us", "inter_floor_us", "codec_floor_us"]] = (
        68900.0,
        4900.0,
        68900.0,
        12000.0,
    )
    harness.loc[newest, "levels"] = "overlapped"
    points = {
        (p.collective, p.against): p
        for p in two_level.two_level_points(Rows(harness=harness, compare=data.get("compare")))
    }
    assert points["allgather", "ring"].expected == pytest.approx(68900 / 73800)
    assert points["allgather", "flat"].expected == pytest.approx(68900 / 113700)


def test_the_notes_quote_the_drawn_points(data):
    figures = two_level.draw_two_level(data, Style())
    caption = figures[0].caption
    assert (
        "Allgather, hierarchical bfp:rate=8 over the flat compressed ring: expected 0.70 "
        "from the floors, measured 1.064 [0.892, 1.268], no difference (load 13.9 -> 18.0)."
    ) in caption.replace("All-gather", "Allgather")
    assert "expected 0.20 from the floors, measured 0.329 [0.315, 0.344], faster" in caption
    assert "sweeps/two-level.toml" in caption
    assert (
        "Reduce-Scatter, through node leaders over per local rank, bfp:rate=8: expected "
        "1.10 from the floors, measured 1.294 [1.236, 1.354], slower"
    ) in caption.replace("Reduce-scatter", "Reduce-Scatter")
    ax = figures[0].fig.axes[0]
    drawn = sorted(round(float(y), 3) for line in ax.lines for y in line.get_ydata())
    # the measured centres and the expected marks drawn are the ones the notes quote
    for value in (1.064, 0.329, round(79100 / 113700, 3), round(79.1 / 404.653184, 3)):
        assert value in drawn


def test_no_comparison_no_figure():
    with pytest.raises(two_level.Skip):
        two_level.draw_two_level(Rows(), Style())


def test_the_sweep_builds_nodes(tmp_path):
    spec = load_spec("sweeps/two-level.toml")
    assert spec.ranks_per_node == 2
    assert {t.link_gbps for t in spec.tasks} == {1} and {t.ranks for t in spec.tasks} == {4}
    bad = tmp_path / "bad.toml"
    bad.write_text(
        '[sweep]\nranks_per_node = 2\n[[points]]\nvariant = "baseline"\nranks = 3\nlink_gbps = 1\n'
    )
    with pytest.raises(UsageError, match="do not make whole nodes of 2"):
        load_spec(bad)


class Drawn:
    def __init__(self, name):
        self.name = name


def test_the_page_links_the_figure_under_its_drawn_name():
    (line,) = two_level.page_link([Drawn("seed000_regime"), Drawn("two_level_links")])
    assert "href='#two_level_links'" in line and "sweeps/two-level.toml" in line
    assert two_level.page_link([Drawn("seed000_regime")]) == []


def test_rows_of_a_cluster_of_nodes_are_a_section_of_their_own():
    from ccbench.plots.data import regime_of

    harness = pd.DataFrame(
        {
            # 2 nodes x 2 ranks on links; 4 nodes of 1 (the flat cluster); one host (shm);
            # a real 2-node run without an emulated link
            "nodes": [2, 4, 1, 2],
            "ranks": [4, 4, 4, 8],
            "link_gbps": [1.0, 1.0, None, None],
        }
    )
    assert list(regime_of("harness", harness)) == ["nodes", "links", "shm", "nodes"]
    compare = pd.DataFrame(
        {
            "a": [FLAT, FLAT, NODE, FLAT],
            "b": [NODE, f"p2p_compressed --codec {CODEC}", LEADER, NODE],
            "ranks": [4, 4, 4, 4],
            "link_gbps": [1.0, 1.0, 1.0, None],  # the last: fake nodes on one host
        }
    )
    assert list(regime_of("compare", compare)) == ["nodes", "links", "nodes", "shm"]
