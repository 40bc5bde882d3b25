"""Graph mode of the harness (--cuda-graph N): what can be captured, and the captured call.

After the eager warm-up the timed call is captured once in a CUDA graph
(kernels/cuda_graph.py); every timed iteration replays it N times between two device
events, as nccl-tests' -G does; the accuracy pass and -c check a replay's output. A call
can be captured only where nothing in it needs the host: device buffers over
torch.distributed reading them itself (NCCL), fixed-size codecs on their device
kernels. Everything else is refused here in one line (exit 2), naming why
(docs/gpu.md, "Graph mode").
"""

from __future__ import annotations

from ccbench.kernels import arrays, switches
from ccbench.kernels.errors import UsageError

REFUSED = "--cuda-graph cannot capture"


def check_options(variant, opts) -> None:
    """Refusals known from the options alone (parse time)."""
    if not arrays.backend(opts.buffer).device:
        raise UsageError(
            f"{REFUSED} -d {opts.buffer}: host buffers, no device work to capture "
            "(use -d torch-cuda or -d cupy)"
        )
    if opts.transport == "mpi":
        raise UsageError(
            f"{REFUSED} --transport mpi: MPI's calls run on the host (device buffers are "
            "staged through host memory, or waited for before MPI reads them); use "
            "--transport torch (NCCL)"
        )
    if opts.warmup == 0:
        raise UsageError(
            "--cuda-graph needs at least one eager warm-up call before the capture (-x 1 or "
            "more): NCCL connects and the codecs allocate their range flag there"
        )


def check_run(variant, opts, comm) -> None:
    """Refusals that need the run's transport and device (after both are set up)."""
    from ccbench.collectives.comm_torch import STAGE_ENV, stages

    if stages(opts.backend, opts.buffer):
        if switches.current().torch_stage == "1":
            raise UsageError(
                f"{REFUSED} {STAGE_ENV}=1: every buffer is staged through host memory (the "
                "host copies it inside the call)"
            )
        raise UsageError(
            f"{REFUSED} --backend {opts.backend} on -d {opts.buffer}: every buffer is "
            "staged through host memory (the host copies it inside the call); use "
            "--backend nccl"
        )
    why = variant.graph_refusal(opts)
    if why:
        raise UsageError(f"{REFUSED} {why}")


def codec_refusal(codec, buffer: str, dtype: str) -> str | None:
    """Why a codec's calls on `buffer` cannot be captured, or None."""
    if codec.name == "none":
        return None
    if not codec.fixed_size:
        return (
            f"--codec {codec.spec}: a variable-size codec, whose payload lengths are read "
            "on the host inside the call"
        )
    path = codec.kernel_path(arrays.empty(buffer, 1, dtype))
    if path != "device":
        return (
            f"--codec {codec.spec} on -d {buffer}: it runs its {path} kernels here, not "
            "the device kernels (cupy), and those allocate temporaries inside the call"
        )
    return None


class GraphedCall:
    """One op's call captured into a graph of the run's backend; `capture` hands the
    timing loop its replay. The bytes the captured call put on the wire are kept: a
    replay moves the same bytes without the Python that counts them."""

    def __init__(self, comm, buffer: str):
        self.comm = comm
        self.graph = arrays.backend(buffer).graph()
        self.wire_bytes = 0

    def capture(self, run):
        before = self.comm.wire_bytes
        self.graph.capture(run)
        self.wire_bytes = self.comm.wire_bytes - before
        return self.graph.replay

    def replay_counted(self) -> None:
        """One replay, the captured call's wire bytes added to the communicator's count
        (set, not added to: the tests' device double re-runs the Python on a replay)."""
        before = self.comm.wire_bytes
        self.graph.replay()
        self.comm.wire_bytes = before + self.wire_bytes
