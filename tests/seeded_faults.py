"""Seeded faults: one-line changes to the tree, each run against the tests meant to catch it.

    python -m tests.seeded_faults              # every fault, one at a time
    python -m tests.seeded_faults bfp-edge 3   # the faults of a class, or by number
    python -m tests.seeded_faults --list       # the classes and their faults, run none
    python -m tests.seeded_faults --help       # this text

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
    behaviour: str  # the class of behaviour the fault breaks
    path: str  # file, from the repository root
    old: str  # text that occurs exactly once in it
    new: str  # its faulty replacement
    tests: str  # pytest arguments that must fail under it


CODEC = "tests/test_behaviours_codec.py"
COSTMODEL = "tests/test_behaviours_costmodel.py"
BUSBW = "tests/test_behaviours_ranks.py -k busbw"
RESULTS = "tests/test_behaviours_results.py"
BREAKDOWN = "tests/test_behaviours_ranks.py -k breakdown"
FEEDBACK = "tests/test_behaviours_training.py"
COMPARE = "tests/test_comparisons.py"
SLOTS = "tests/test_behaviours_ranks.py -k slots"
TORCH = "tests/test_torch_transport_checks.py"
LAUNCH = "tests/test_launch_check.py"
RESULTS_RUNS = "tests/test_results_runs.py"
GATE_RECORDS = " ".join(  # the gate's records, without launches
    f"tests/test_gate.py::{name}"
    for name in (
        "test_both_sides_kernels_are_recorded",
        "test_a_point_past_the_threshold_runs_as_many_rounds_again",
        "test_each_sides_kernels_are_asked_of_its_own_code",
        "test_a_base_without_the_trees_compiled_kernels_is_refused",
    )
)
GATE_BUILT = "tests/test_gate.py -k near_the_threshold"
OSU = " ".join(  # osu-check's rounds and verdicts, with a scripted runner
    f"tests/test_osu_check.py::{name}"
    for name in (
        "test_the_verdict_and_exit_status_of_a_point",
        "test_one_inconclusive_point_among_agreeing_ones_exits_1",
        "test_the_first_side_alternates_from_round_to_round",
        "test_ccbench_side_is_its_average_as_osus_is",
        "test_a_time_of_zero_has_no_ratio",
    )
)
DEVICE = "tests/test_device_accounting.py"
TRACES = "tests/test_trace_checks.py"
FLOOR = "tests/test_floor.py"
DEVICE_KERNELS = "tests/test_codec_device.py -k emulated"
STAGING = "tests/test_staging.py"
LIBRARY = "tests/test_collective_spec.py -k library"
ADVISE_INPUTS = "tests/test_advise_reading.py"
ADVISE_TURNS = "tests/test_advise_turns.py"
ADVISE_SIZES = "tests/test_advise_levels.py tests/test_advise_ranking.py"
SPEC_WORK = "tests/test_collective_spec.py -k codec_work"
TYPED_ROWS = "tests/test_schemas.py -k older"
FEEDBACK_BLOCKS = "tests/test_behaviours_training.py -k per_rank_block"
STAGING_BOUND = "tests/test_staging.py -k slowest"
GPU_GOALS = "tests/test_gpu_check.py -k newest_row"
REGISTRY = "tests/test_behaviours_training.py -k omnireduce"

# fmt: off
FAULTS = [
    # bfp's shared exponent steps up at max|x| = 2**e (1 - 2**-R), in each implementation
    Fault("bfp-edge", "kernels/codec_bfp.py",
          "bump = xp.astype(amax_bits.view(xp.float32) >= edge",
          "bump = xp.astype(amax_bits.view(xp.float32) > edge", CODEC),
    Fault("bfp-edge", "kernels/codec_bfp.py", 'edge = pow2 - pow2 * 2.0**-self.rate  # exact',
          'edge = pow2 - pow2 * 2.0 ** -(self.rate + 1)  # exact', CODEC),
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
          'return AlphaBeta(2 * np.log2(p) * self.hop_latency_us, 2 * (p - 1) / p * self.us_per_byte)',
          'return AlphaBeta(2 * np.log2(p) * self.hop_latency_us, (p - 1) / p * self.us_per_byte)', COSTMODEL),
    Fault("rabenseifner", "collectives/costmodel.py",
          'return {"ring": self.ring_allreduce, "rabenseifner": self.rabenseifner_allreduce}[\n'
          '                algorithm\n'
          '            ](p)', 'return {"ring": self.ring_allreduce, "rabenseifner": self.ring_allreduce}[algorithm](p)',
          COSTMODEL),
    # bus bandwidth factors beyond two ranks
    Fault("busbw", "collectives/spec.py", 'reduces=False,\n'
                                          '            busbw=lambda n: (n - 1) / n,\n'
                                          '            ring_hops=lambda n: n - 1,\n'
                                          '            counts=_gathered,',
          'reduces=False,\n'
          '            busbw=lambda n: 1 / n,\n'
          '            ring_hops=lambda n: n - 1,\n'
          '            counts=_gathered,', BUSBW),
    Fault("busbw", "collectives/spec.py", 'reduces=False,\n'
                                          '            busbw=lambda n: (n - 1) / n,\n'
                                          '            ring_hops=lambda n: n - 1,\n'
                                          '            counts=_gathered,',
          'reduces=False,\n'
          '            busbw=lambda n: 1 - 1 / n**2,\n'
          '            ring_hops=lambda n: n - 1,\n'
          '            counts=_gathered,', BUSBW),
    Fault("busbw", "collectives/spec.py", 'reduces=True,\n'
                                          '            busbw=lambda n: (n - 1) / n,\n'
                                          '            ring_hops=lambda n: n - 1,\n'
                                          '            counts=_scattered,',
          'reduces=True,\n'
          '            busbw=lambda n: 1 / n,\n'
          '            ring_hops=lambda n: n - 1,\n'
          '            counts=_scattered,', BUSBW),
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
    Fault("gate", "scripts/comparisons/gate.py", 'return (\n'
                                                 '        row.get("ratio") is not None and row["ratio"] >= threshold and low is not None and low > 1\n'
                                                 '    )',
          'return row.get("ratio") is not None and row["ratio"] > threshold and low is not None and low > 1', RESULTS),
    Fault("gate", "scripts/comparisons/gate.py", "and low > 1", "and low >= 1", RESULTS),
    Fault("gate", "scripts/comparisons/gate.py", "and low > 1", "and low > 0", RESULTS),
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
          'DECODE,\n'
          '                self.codec.decode,',
          'ENCODE,\n'
          '                self.codec.decode,', BREAKDOWN),
    Fault("breakdown", "benchmarks/compressed_base.py", "critical = max(range(len(everyone))",
          "critical = min(range(len(everyone))", BREAKDOWN),
    Fault("breakdown", "benchmarks/compressed_base.py",
          "values, sent, _, _ = everyone[critical]",
          "values, sent, _, _ = everyone[0]", BREAKDOWN),
    # error feedback: r = g - decode(encode(g)), applied by every trainer that keeps it
    Fault("feedback", "training/gradient_comm.py", "torch.sub(grad, residual, out=residual)",
          "torch.sub(residual, grad, out=residual)", FEEDBACK),
    Fault("feedback", "training/gradient_comm.py", "        grad.add_(residual)\n",
          "        grad.sub_(residual)\n", FEEDBACK),
    Fault("feedback", "training/sharded.py", "            self.feedback.apply(",
          "            None and self.feedback.apply(", FEEDBACK),
    Fault("feedback", "training/sharded.py", 'self.feedback.apply("flat", flat.grads, comm.size)',
          'self.feedback.apply("flat", flat.params, comm.size)', FEEDBACK),
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
    Fault("alternation", "scripts/comparisons/compare.py", 'first = "A" if done % 2 == 0 else "B"',
          'first = "A"', COMPARE),
    Fault("alternation", "scripts/comparisons/rounds.py",
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
    # the torch transport: wire bytes of what is sent, staging that copies both ways, the
    # control plane's min, receives posted at exactly the payload's size
    Fault("torch-transport", "collectives/comm_torch.py",
          "            self.wire_bytes += nbytes(sendbuf)\n",
          "            self.wire_bytes += nbytes(recvbuf)\n", TORCH),
    Fault("torch-transport", "collectives/comm_torch.py",
          "            if r is not recv_t:\n                self._copy(recv_t, r)",
          "            if False:\n                self._copy(recv_t, r)", TORCH),
    Fault("torch-transport", "collectives/comm_torch.py",
          "return mirror, lambda: self._copy(t, mirror)", "return mirror, None", TORCH),
    Fault("torch-transport", "collectives/comm_torch.py",
          "return not self.stage_all and (t.device.type", "return (t.device.type", TORCH),
    Fault("torch-transport", "collectives/comm_torch.py", '"min": self.dist.ReduceOp.MIN,',
          '"min": self.dist.ReduceOp.MAX,', TORCH),
    Fault("torch-transport", "collectives/compressed_ordered.py",
          'if codec.fixed_size:',
          'if False:', TORCH),
    Fault("torch-transport", "collectives/compressed.py",
          "incoming = self.recv_payload[:capacity]", "incoming = self.recv_payload", TORCH),
    # the launch check: inside an srun step, the MPI launcher's size and rank win
    Fault("launch-check", "collectives/launch.py",
          'SIZE_VARIABLES = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_STEP_NUM_TASKS")',
          'SIZE_VARIABLES = ("SLURM_STEP_NUM_TASKS", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE")',
          LAUNCH),
    Fault("launch-check", "collectives/launch.py",
          'RANK_VARIABLES = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID", "RANK")',
          'RANK_VARIABLES = ("SLURM_PROCID", "PMI_RANK", "OMPI_COMM_WORLD_RANK", "RANK")',
          LAUNCH),
    # the results model across runs and versions; regress at its tolerances' edges
    Fault("results-model", "benchmarks/results.py",
          'document.setdefault("runs", {})[run_id] = record',
          'document["runs"] = {run_id: record}', RESULTS_RUNS),
    Fault("results-model", "scripts/sweeps/merge.py", "for row in table.current():",
          "for row in table.rows:", RESULTS_RUNS),
    Fault("results-model", "scripts/sweeps/merge.py", "runs.update(Sidecar(p).runs())",
          "runs = Sidecar(p).runs()", RESULTS_RUNS),
    Fault("results-model", "scripts/sweeps/regress.py", "EXACT_RTOL = 1e-12", "EXACT_RTOL = 1e-6",
          RESULTS_RUNS),
    Fault("results-model", "scripts/sweeps/regress.py", "inside = lo <= n <= hi",
          "inside = lo < n < hi", RESULTS_RUNS),
    Fault("results-model", "scripts/sweeps/regress.py",
          '_finding("FAIL", metric, point, r, "(missing)"',
          '_finding("ok", metric, point, r, "(missing)"', RESULTS_RUNS),
    # the gate: the second look's rounds run, each side's kernels recorded and compared
    Fault("gate-records", "scripts/comparisons/gate.py",
          'suspects,\n'
          '                        launcher,\n'
          '                        2 * rounds,\n'
          '                        Path(tmp),\n'
          '                        bar,\n'
          '                        first=first,\n'
          '                        after_round=keep,', 'suspects, launcher, rounds, Path(tmp), bar, first=first, after_round=keep',
          GATE_RECORDS),
    Fault("gate-records", "scripts/comparisons/gate.py", 'if base != "fused" and tree == "fused":',
          "if False:", GATE_RECORDS),
    Fault("gate-records", "scripts/comparisons/gate.py",
          "        check_kernels(kernel_path(base_root), kernel_path(tree_root))\n", "",
          GATE_RECORDS),
    Fault("gate-records", "scripts/comparisons/revisions.py",
          '"fused" if os.path.abspath(kernels.__file__).startswith(root) else "borrowed")',
          '"fused")', GATE_RECORDS),
    Fault("gate-records", "scripts/comparisons/revisions.py",
          "    build_extensions(source, rev)\n    return link_rooms",
          "    return link_rooms", GATE_BUILT),
    # osu-check: positive times, alternating sides, average against average, exit status
    Fault("osu-check", "benchmarks/statistics.py",
          "    if np.any(a <= 0) or np.any(b <= 0):\n        raise ValueError(\"times must be "
          "positive\")\n    ratios = np.sort(b / a)",
          "    if np.any(a < 0) or np.any(b < 0):\n        raise ValueError(\"times must be "
          "positive\")\n    ratios = np.sort(b / a)", OSU),
    Fault("osu-check", "scripts/comparisons/osu_check.py", "            if r % 2 == 0:",
          "            if True:", OSU),
    Fault("osu-check", "scripts/comparisons/osu_check.py", 'return float(rows[-1]["avg_us"])',
          'return float(rows[-1]["p50_us"])', OSU),
    Fault("osu-check", "scripts/comparisons/osu_check.py", "return 1 if differing or unsure else 0",
          "return 1 if differing else 0", OSU),
    # device accounting: staging by default, syncs per call, the casts' range edges on
    # every path, the vector loops' tails, the device path's dtypes
    Fault("device-accounting", "collectives/comm.py",
          'gpu_aware = switches.current().gpu_aware == "1"',
          'gpu_aware = switches.current().gpu_aware != "0"', DEVICE),
    Fault("device-accounting", "benchmarks/timing.py",
          "host_syncs=syncs / calls if watch.on_device",
          "host_syncs=syncs / iterations if watch.on_device", DEVICE),
    Fault("device-accounting", "kernels/codec_cast.py", '"float16": 0x477FF000',
          '"float16": 0x477FF001', DEVICE),
    Fault("device-accounting", "kernels/codec_cast.py",
          "if worst >= OVERFLOW_BITS[self.target]", "if worst > OVERFLOW_BITS[self.target]",
          DEVICE),
    Fault("device-accounting", "kernels/codec_cast.py",
          "return xp.logical_and(-overflow < xp.min(x), xp.max(x) < overflow)",
          "return xp.logical_and(-overflow < xp.min(x), xp.max(x) <= overflow)", DEVICE),
    Fault("device-accounting", "kernels/fused_cast.c", "#define F16_OVERFLOW_BITS 0x477FF000",
          "#define F16_OVERFLOW_BITS 0x477FF001", DEVICE),
    Fault("device-accounting", "kernels/fused_cast.c",
          "        worst = magnitude(x[i]) > worst ? magnitude(x[i]) : worst;\n"
          "        store16(out + 2 * i, to_half(x[i]));",
          "        store16(out + 2 * i, to_half(x[i]));", DEVICE),
    Fault("device-accounting", "kernels/fused_cast.c",
          "            worst = magnitude(t) > worst ? magnitude(t) : worst;\n"
          "            store16(out + 2 * i, to_half(t));",
          "            store16(out + 2 * i, to_half(t));", DEVICE),
    Fault("device-accounting", "kernels/codec_fused.py",
          "    if _is_float32(x) and _contiguous(x) and device_kernels(x) is not None:",
          "    if _contiguous(x) and device_kernels(x) is not None:", DEVICE),
    # the device kernels keep subnormals as the host does (cupy compiles with -ftz=true)
    Fault("device-kernels", "kernels/codec_device.cu", "t[k] = add_rn(t[k], mine[k]);",
          "t[k] = __fadd_rn(t[k], mine[k]);", DEVICE_KERNELS),
    Fault("device-kernels", "kernels/codec_device.cu",
          "step[c] = mul_rn(__int_as_float((e[c] + 1) << 23)",
          "step[c] = __fmul_rn(__int_as_float((e[c] + 1) << 23)", DEVICE_KERNELS),
    # traces: replay validation agreed by every rank, capture's means, PARAM timestamps
    Fault("traces", "benchmarks/trace_replay.py",
          'return bool(comm.allreduce_value(int(ok), op="min"))',
          'return bool(comm.allreduce_value(int(ok), op="max"))', TRACES),
    Fault("traces", "training/trace_capture.py",
          'mean = comm.allreduce_array(local, "sum") / comm.size',
          'mean = comm.allreduce_array(local, "sum")', TRACES),
    Fault("traces", "training/trace_capture.py",
          'measured_mean = comm.allreduce_array(measured, "sum") / comm.size',
          'measured_mean = comm.allreduce_array(measured, "sum")', TRACES),
    Fault("traces", "collectives/trace_param.py",
          "clock += (e.run_us or 0.0) if e.blocking else 0.0", "clock += e.run_us or 0.0",
          TRACES),
    Fault("traces", "collectives/trace_param.py", "            clock += e.waited_us or 0.0\n", "",
          TRACES),
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
    Fault("floor", "plots/base.py", 'wire_bytes(frame),\n'
                                    '            rate_bps,\n'
                                    '            _column(frame, "link_burst_bytes").fillna(0.0),\n'
                                    '            steps,\n'
                                    '            _column(frame, "link_step_us").fillna(0.0) * 1e-6,',
          'wire_bytes(frame), rate_bps, _column(frame, "link_burst_bytes").fillna(0.0), steps, 0.0', FLOOR),
    # the codec's floor from every sharing rank's fastest timed call, and the chunk model
    Fault("codec_floor", "collectives/costmodel.py",
          "return float(max(cpu.max(), cpu.mean() * codec_share))",
          "return float(cpu.max() * max(1.0, codec_share))", FLOOR),
    Fault("codec_floor", "benchmarks/compressed_base.py",
          "sharing = [everyone[r][3] for r in sharing_ranks(places, critical, on_device)]",
          "sharing = [values[CODEC_CPU]]", FLOOR),
    Fault("codec_floor", "collectives/pipeline.py", "        return np.min(rows, axis=0)",
          "        return np.mean(rows, axis=0)", FLOOR),
    Fault("codec_floor", "collectives/costmodel.py",
          "    chunk = (p - 1) * n * max(chunk_s, 0.0)", "    chunk = 0.0", FLOOR),
    Fault("codec_floor", "collectives/costmodel.py", 'gaps = (\n'
                                                     '        (p - 2) * max(0.0, b / (n * wire_bps) + b / (n * codec_bps) - b / wire_bps)\n'
                                                     '        if reduces\n'
                                                     '        else 0.0\n'
                                                     '    )',
          'gaps = 0 * max(0.0, b / (n * wire_bps) + b / (n * codec_bps) - b / wire_bps) if reduces else 0.0', FLOOR),
    # the launcher's vector path: every buffer on 16 bytes (8 is a misaligned access)
    Fault("device-launch", "kernels/codec_device.py",
          "return all(a % VECTOR_ALIGN == 0 for a in addresses)",
          "return all(a % 8 == 0 for a in addresses)", DEVICE_KERNELS),
    # MPI staging: a receive's length from MPI's status; each copy stream ordered behind
    # what it reads (the producer's kernels; the consumer waits for the H2D copy)
    Fault("mpi-staging", "collectives/mpi_staging.py",
          "count = status.Get_count(MPI.BYTE) if status is not None else nbytes(self.out)",
          "count = nbytes(self.out)", STAGING),
    Fault("mpi-staging", "collectives/mpi_staging.py",
          "b.stream_wait(self.produced, self.d2h)", "b.stream_wait(self.produced)", STAGING),
    Fault("mpi-staging", "collectives/mpi_staging.py", "self.backend.stream_wait(event)",
          "self.backend.stream_wait(event, self.h2d)", STAGING),
    # the library algorithm's uncompressed equivalent: the gather phase sends n - 1 blocks
    Fault("library-accounting", "collectives/compressed_library.py",
          "return (self.size - 1) * self.lengths[self.rank]",
          "return self.size * self.lengths[self.rank]", LIBRARY),
    # advise's inputs: a row's step cost in microseconds; the main collective by volume
    Fault("advise-inputs", "scripts/advise/parts.py",
          'float(np.nan_to_num(_number(row, "link_step_us"))) * 1e-6,',
          'float(np.nan_to_num(_number(row, "link_step_us"))) * 1e-3,', ADVISE_INPUTS),
    Fault("advise-inputs", "scripts/advise/parts.py", "np.nan_to_num(step) * 1e-6,",
          "np.nan_to_num(step) * 1e-3,", ADVISE_INPUTS),
    Fault("advise-inputs", "scripts/advise/table.py",
          "volume[c.collective] = volume.get(c.collective, 0) + c.nbytes",
          "volume[c.collective] = c.nbytes", ADVISE_INPUTS),
    # advise's per-call costs: the excess over the floor interpolated between sizes, the
    # rows timed back to back first, the parts at the step's sizes
    Fault("advise-sizes", "collectives/compression_model.py",
          "extra = np.where(size < sizes[0], below, np.interp(size, sizes, excess))",
          "extra = np.where(size < sizes[0], below, excess[-1])", ADVISE_SIZES),
    Fault("advise-sizes", "collectives/compression_model.py",
          "below = np.maximum(excess[0] + slope * (size - sizes[0]), min(excess[0], 0.0))",
          "below = excess[0] + slope * (size - sizes[0])", ADVISE_SIZES),
    Fault("advise-sizes", "scripts/advise/efficiency.py", "chosen = back_to_back or chosen",
          "chosen = chosen", ADVISE_SIZES),
    Fault("advise-sizes", "scripts/advise/measure.py",
          "size -= size % (ALIGN * ranks)", "size -= size % (ALIGN * ranks) + ALIGN",
          ADVISE_SIZES),
    # advise's calls in a step: in turn after another collective only, the diluted
    # factor solved, a hand-off only where a thread wakes, part replays with no compute
    Fault("advise-turns", "collectives/compression_model.py",
          "after_other = calls[k - 1].collective != call.collective",
          "after_other = True", ADVISE_TURNS),
    Fault("advise-turns", "scripts/advise/turns.py",
          "return (calls - 1) * measured / (calls - measured)", "return measured",
          ADVISE_TURNS),
    Fault("advise-turns", "collectives/compression_model.py",
          "start = max(now, stream_free) + (half if now >= stream_free else 0.0)",
          "start = max(now, stream_free) + half", ADVISE_TURNS),
    Fault("advise-turns", "scripts/advise/turns.py",
          'and _number(r, "compute_scale") == 0', 'and _number(r, "compute_scale") >= 0',
          ADVISE_TURNS),
    Fault("advise-turns", "scripts/advise/measure.py", '"--compute-scale",\n            "0",',
          '"--compute-scale",\n            "1",', ADVISE_TURNS),
    # the check's verdict counts the predictions of options measured here
    Fault("advise-verdict", "collectives/compression_model.py",
          'counted = [r for r in timed if (r.get("measured_here") or "yes") == "yes"]',
          "counted = timed", "tests/test_advise.py -k assumed_inputs"),
    # host tensors reach the compressed collectives as views of their memory, not copies
    Fault("host-views", "training/gradient_comm.py", "    return t.detach().numpy()\n",
          "    return t.detach().numpy().copy()\n", FEEDBACK + " -k numpy_views"),
    # the collective-level allreduce's codec work per rank, in blocks
    Fault("collective-specs", "collectives/spec.py", "coll_codec_blocks=lambda n: (2, n, n - 2),",
          "coll_codec_blocks=lambda n: (2, n - 1, n - 2),", SPEC_WORK),
    # an older file's undeclared columns: a measurement by its name's suffix
    Fault("typed-rows", "benchmarks/schema_model.py",
          "if column in LEGACY_MEASURED or column.endswith(LEGACY_SUFFIXES):",
          "if column in LEGACY_MEASURED:", TYPED_ROWS),
    # error feedback's round trip, per rank block as the ring encodes
    Fault("feedback-blocks", "training/gradient_comm.py",
          "bounds = block_bounds(x.numel(), blocks)", "bounds = block_bounds(x.numel(), 1)",
          FEEDBACK_BLOCKS),
    # the staging bound's parts: the slowest rank's time
    Fault("staging-bound", "benchmarks/staging_bound.py",
          'return comm.allreduce_value(elapsed, "max") * 1e6',
          'return comm.allreduce_value(elapsed, "min") * 1e6', STAGING_BOUND),
    # the GPU goals: the newest staging row at the goal's size
    Fault("gpu-goals", "scripts/gpu/goals.py", '    r = at[-1]\n    ratio = float(r["staged_vs_bound"])',
          '    r = at[0]\n    ratio = float(r["staged_vs_bound"])', GPU_GOALS),
    # the registry: sparse streaming carries gradients through OmniReduce
    Fault("variant-registry", "kernels/variants.py", '        gradient_algorithm="omnireduce",\n', "",
          REGISTRY),
]
# fmt: on


def build_kernels() -> None:
    """Rebuild the compiled kernels in place (an editable install's)."""
    subprocess.run(
        [
            sys.executable,
            "-c",
            "from setuptools import setup; setup()",
            "build_ext",
            "--inplace",
            "-q",
        ],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )


def run_fault(fault: Fault) -> tuple[bool, str]:
    """(caught, pytest's last line) with `fault` in the tree; the tree is put back."""
    path = ROOT / fault.path
    text = path.read_text()
    if text.count(fault.old) != 1:
        raise SystemExit(
            f"seeded_faults: {fault.path}: the text to change occurs "
            f"{text.count(fault.old)} times, not once: {fault.old!r}"
        )
    path.write_text(text.replace(fault.old, fault.new))
    try:
        if path.suffix == ".c":
            build_kernels()
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "-x",
                "-p",
                "no:cacheprovider",
                *fault.tests.split(),
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
        )
    finally:
        path.write_text(text)
        if path.suffix == ".c":
            build_kernels()
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    return proc.returncode != 0, lines[-1] if lines else ""


def main(argv: list[str]) -> int:
    if {"-h", "--help"} & set(argv):
        print(__doc__)
        return 0
    if "--list" in argv:
        for i, f in enumerate(FAULTS):
            print(
                f"{i:3} {f.behaviour:<17} {f.path}: {f.new.strip().splitlines()[0][:60]!r}"
                if f.new.strip()
                else f"{i:3} {f.behaviour:<17} {f.path}: (removed) "
                f"{f.old.strip().splitlines()[0][:50]!r}"
            )
        return 0
    unknown = [a for a in argv if not a.isdigit() and a not in {f.behaviour for f in FAULTS}]
    if unknown:
        raise SystemExit(f"seeded_faults: no class {', '.join(unknown)} (--list shows them)")
    chosen = [
        (i, f) for i, f in enumerate(FAULTS) if not argv or f.behaviour in argv or str(i) in argv
    ]
    missed = 0
    for i, fault in chosen:
        started = time.monotonic()
        caught, last = run_fault(fault)
        missed += not caught
        change = (fault.new.strip() or "(removed) " + fault.old.strip()).splitlines()[0][:60]
        print(
            f"{i:3} {fault.behaviour:<17} {'caught' if caught else 'MISSED':<7} "
            f"{fault.path}: {change!r}  [{last}] {time.monotonic() - started:.0f}s",
            flush=True,
        )
    print(f"# {len(chosen)} faults, {len(chosen) - missed} caught, {missed} missed")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
