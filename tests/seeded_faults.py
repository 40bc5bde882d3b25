"""Seeded faults: one-line changes to the tree, each run against the tests meant to catch it.

    python -m tests.seeded_faults              # every fault, one at a time
    python -m tests.seeded_faults bfp-edge 3   # the faults of a class, or by number

Each fault is put into the working tree, the named tests run, and the tree is put back
(compiled kernels are rebuilt in place before and after a C fault). A fault is *caught*
when its tests fail; the program exits 1 if any fault is missed. It changes files in
place: run it on a clean tree of an editable install (scripts/setup.sh), not while
editing. tests/test_seeded_faults.py checks, in CI, that every fault still applies to the
tree (its text occurs once), so the list cannot quietly stop testing anything.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Fault:
    behaviour: str   # the class of behaviour the fault breaks
    path: str        # file, from the repository root
    old: str         # text that occurs exactly once in it
    new: str         # its faulty replacement
    tests: str       # pytest arguments that must fail under it


CODEC = "tests/test_behaviours_codec.py"
COSTMODEL = "tests/test_behaviours_costmodel.py"
BUSBW = "tests/test_behaviours_ranks.py -k busbw"
RESULTS = "tests/test_behaviours_results.py"
BREAKDOWN = "tests/test_behaviours_ranks.py -k breakdown"
FEEDBACK = "tests/test_behaviours_training.py"
COMPARE = "tests/test_behaviours_compare.py"
SLOTS = "tests/test_behaviours_ranks.py -k slots"
FLOOR = "tests/test_floor.py"

FAULTS = [
    # bfp's shared exponent steps up at max|x| = 2**e (1 - 2**-R), in each implementation
    Fault("bfp-edge", "kernels/codec_bfp.py",
          "bump = xp.astype(amax_bits.view(xp.float32) >= edge",
          "bump = xp.astype(amax_bits.view(xp.float32) > edge", CODEC),
    Fault("bfp-edge", "kernels/codec_bfp.py", "edge = pow2 - pow2 * 2.0**-self.rate",
          "edge = pow2 - pow2 * 2.0**-(self.rate + 1)", CODEC),
    Fault("bfp-edge", "kernels/fused_bfp.c", "exponents[j] = (uint8_t)(e + (a >= edge));",
          "exponents[j] = (uint8_t)(e + (a > edge));", CODEC),
    Fault("bfp-edge", "kernels/fused_bfp.c", "amax[j] = e + (a >= edge);",
          "amax[j] = e + (a > edge);", CODEC),
    Fault("bfp-edge", "kernels/fused_bfp.c", "0x800000 - (1 << (24 - rate))",
          "0x800000 - (1 << (23 - rate))", CODEC),
    Fault("bfp-edge", "kernels/fused_bfp.c",
          "const int32_t edge = e ? (int32_t)((uint32_t)e << 23) + mantissa : subnormal;",
          "const int32_t edge = (int32_t)((uint32_t)e << 23) + mantissa;", CODEC),
    # the Rabenseifner allreduce model: 2 lg p hops, 2 (p-1)/p of the data
    Fault("rabenseifner", "collectives/costmodel.py",
          "return AlphaBeta(2 * np.log2(p) * self.hop_latency_us,",
          "return AlphaBeta(np.log2(p) * self.hop_latency_us,", COSTMODEL),
    Fault("rabenseifner", "collectives/costmodel.py",
          "self.hop_latency_us,\n                         2 * (p - 1) / p * self.us_per_byte)"
          "\n\n    def allreduce",
          "self.hop_latency_us,\n                         (p - 1) / p * self.us_per_byte)"
          "\n\n    def allreduce", COSTMODEL),
    Fault("rabenseifner", "collectives/costmodel.py",
          '"rabenseifner": self.rabenseifner_allreduce}', '"rabenseifner": self.ring_allreduce}',
          COSTMODEL),
    # bus bandwidth factors beyond two ranks
    Fault("busbw", "collectives/spec.py", "reduces=False, busbw=lambda n: (n - 1) / n",
          "reduces=False, busbw=lambda n: 1 / n", BUSBW),
    Fault("busbw", "collectives/spec.py", "reduces=False, busbw=lambda n: (n - 1) / n",
          "reduces=False, busbw=lambda n: 1 - 1 / n**2", BUSBW),
    Fault("busbw", "collectives/spec.py", "reduces=True, busbw=lambda n: (n - 1) / n",
          "reduces=True, busbw=lambda n: 1 / n", BUSBW),
    Fault("busbw", "collectives/spec.py", "busbw=lambda n: 2 * (n - 1) / n",
          "busbw=lambda n: n / (2 * (n - 1))", BUSBW),
    Fault("busbw", "benchmarks/harness.py", "spec(case.collective).busbw(case.ranks)",
          "spec(case.collective).busbw(2)", BUSBW),
    # a CSV header of the same width with other or reordered columns
    Fault("header", "benchmarks/results.py", "if list(header) != list(columns):",
          "if len(header) != len(columns):", RESULTS),
    Fault("header", "benchmarks/results.py", "if list(header) != list(columns):",
          "if sorted(header) != sorted(columns):", RESULTS),
    # the gate: fail at B/A >= threshold with the interval above 1
    Fault("gate", "scripts/gate.py", 'row["ratio"] >= threshold', 'row["ratio"] > threshold',
          RESULTS),
    Fault("gate", "scripts/gate.py", "and low > 1", "and low >= 1", RESULTS),
    Fault("gate", "scripts/gate.py", "and low > 1", "and low > 0", RESULTS),
    # the time breakdown: encode and decode in their own columns, the critical rank's row
    Fault("breakdown", "collectives/compressed.py",
          "data = timed(timing, ENCODE, self.codec.encode",
          "data = timed(timing, DECODE, self.codec.encode", BREAKDOWN),
    Fault("breakdown", "collectives/compressed.py",
          "            timed(timing, DECODE, self.codec.decode, incoming, out)",
          "            timed(timing, ENCODE, self.codec.decode, incoming, out)", BREAKDOWN),
    Fault("breakdown", "collectives/compressed.py",
          "return timed(self.breakdown, ENCODE, self.codec.encode, x, slot)",
          "return timed(self.breakdown, DECODE, self.codec.encode, x, slot)", BREAKDOWN),
    Fault("breakdown", "collectives/compressed.py",
          "timed(self.breakdown, ENCODE, self.codec.encode, x[a:b]",
          "timed(self.breakdown, DECODE, self.codec.encode, x[a:b]", BREAKDOWN),
    Fault("breakdown", "collectives/compressed.py",
          "            timed(self.breakdown, DECODE, self.codec.decode, payload, out)",
          "            timed(self.breakdown, ENCODE, self.codec.decode, payload, out)",
          BREAKDOWN),
    Fault("breakdown", "collectives/compressed.py",
          "timed(self.breakdown, DECODE, self.codec.decode,\n",
          "timed(self.breakdown, ENCODE, self.codec.decode,\n", BREAKDOWN),
    Fault("breakdown", "benchmarks/compressed_base.py", "critical = max(range(len(everyone))",
          "critical = min(range(len(everyone))", BREAKDOWN),
    Fault("breakdown", "benchmarks/compressed_base.py",
          "values, sent, _ = everyone[critical]",
          "values, sent, _ = everyone[0]", BREAKDOWN),
    # error feedback: r = g - decode(encode(g)), applied by every trainer that keeps it
    Fault("feedback", "training/transport.py", "torch.sub(grad, residual, out=residual)",
          "torch.sub(residual, grad, out=residual)", FEEDBACK),
    Fault("feedback", "training/transport.py", "        grad.add_(residual)\n",
          "        grad.sub_(residual)\n", FEEDBACK),
    Fault("feedback", "training/sharded.py", "torch.sub(grads, residual, out=residual)",
          "torch.sub(residual, grads, out=residual)", FEEDBACK),
    Fault("feedback", "training/sharded.py", "grads.add_(residual)", "grads.sub_(residual)",
          FEEDBACK),
    Fault("feedback", "training/frameworks.py",
          "                if self.feedback is not None:  # residual memory",
          "                if False:  # residual memory", FEEDBACK),
    Fault("feedback", "training/torch_hooks.py",
          "            if self.feedback is not None:\n                self.feedback.apply((",
          "            if False:\n                self.feedback.apply((", FEEDBACK),
    Fault("feedback", "training/torch_hooks.py",
          "                if self.feedback is not None:\n                    self.feedback.apply(",
          "                if False:\n                    self.feedback.apply(", FEEDBACK),
    # the alternation of sides: per turn inside a launch, per round across launches
    Fault("alternation", "benchmarks/paired.py",
          "order = (0, 1) if (k + start) % 2 == 0 else (1, 0)", "order = (0, 1)", COMPARE),
    Fault("alternation", "benchmarks/paired.py", "if (k + start) % 2 == 0", "if k % 2 == 0",
          COMPARE),
    Fault("alternation", "benchmarks/paired.py", 'start = 0 if opts.first == "A" else 1',
          "start = 0", COMPARE),
    Fault("alternation", "scripts/compare.py", 'first = "A" if done % 2 == 0 else "B"',
          'first = "A"', COMPARE),
    Fault("alternation", "scripts/comparison.py",
          "order = (comparison.a, comparison.b) if k % 2 == 0 else (comparison.b, comparison.a)",
          "order = (comparison.a, comparison.b)", COMPARE),
    # OmniReduce's --slots: the streams of every aggregator
    Fault("slots", "collectives/omnireduce_layout.py",
          "nstreams = min(len(agg_ranks) * streams_per_aggregator, nblocks)",
          "nstreams = min(len(agg_ranks) * 2, nblocks)", SLOTS),
    Fault("slots", "collectives/omnireduce_layout.py", "agg_ranks[s % len(agg_ranks)]",
          "agg_ranks[0]", SLOTS),
    Fault("slots", "benchmarks/sparse_streaming.py", "opts.slots if driven else opts.streams",
          "opts.streams if driven else opts.slots", SLOTS),
    Fault("slots", "benchmarks/sparse_streaming.py", "opts.slots if driven else opts.streams",
          "DEFAULT_SLOTS if driven else opts.streams", SLOTS),
    # the one floor of a call: past the burst, plus each step's fixed cost, the codec's
    # share per device, and the plots' floor from the same inputs
    Fault("floor", "collectives/costmodel.py",
          "bits = np.maximum(wire_bytes - burst_bytes, 0.0) * 8.0",
          "bits = np.maximum(wire_bytes, 0.0) * 8.0", FLOOR),
    Fault("floor", "collectives/costmodel.py", "    return bits / rate_bps + steps * step_s",
          "    return bits / rate_bps", FLOOR),
    Fault("floor", "benchmarks/compressed_base.py",
          "    return per_core, float(sum(1 for p in same_host if p[2] == device))",
          "    return per_core, 1.0", FLOOR),
    Fault("floor", "plots/base.py", '_column(frame, "link_step_us").fillna(0.0) * 1e-6',
          "0.0", FLOOR),
]


def build_kernels() -> None:
    """Rebuild the compiled kernels in place (an editable install's)."""
    subprocess.run([sys.executable, "-c", "from setuptools import setup; setup()",
                    "build_ext", "--inplace", "-q"], cwd=ROOT, check=True, capture_output=True)


def run_fault(fault: Fault) -> tuple[bool, str]:
    """(caught, pytest's last line) with `fault` in the tree; the tree is put back."""
    path = ROOT / fault.path
    text = path.read_text()
    if text.count(fault.old) != 1:
        raise SystemExit(f"seeded_faults: {fault.path}: the text to change occurs "
                         f"{text.count(fault.old)} times, not once: {fault.old!r}")
    path.write_text(text.replace(fault.old, fault.new))
    try:
        if path.suffix == ".c":
            build_kernels()
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p",
                               "no:cacheprovider", *fault.tests.split()],
                              cwd=ROOT, capture_output=True, text=True,
                              env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    finally:
        path.write_text(text)
        if path.suffix == ".c":
            build_kernels()
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    return proc.returncode != 0, lines[-1] if lines else ""


def main(argv: list[str]) -> int:
    chosen = [(i, f) for i, f in enumerate(FAULTS)
              if not argv or f.behaviour in argv or str(i) in argv]
    missed = 0
    for i, fault in chosen:
        started = time.monotonic()
        caught, last = run_fault(fault)
        missed += not caught
        change = fault.new.strip().splitlines()[0][:60]
        print(f"{i:3} {fault.behaviour:<12} {'caught' if caught else 'MISSED':<7} "
              f"{fault.path}: {change!r}  [{last}] {time.monotonic() - started:.0f}s",
              flush=True)
    print(f"# {len(chosen)} faults, {len(chosen) - missed} caught, {missed} missed")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
