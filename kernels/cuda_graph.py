"""CUDA graphs (--cuda-graph N): one call captured once, then replayed as one launch.

A graph replays the device work of the captured call (kernels, NCCL collectives and
point-to-point calls) without the Python that issued it: the host's cost per call drops
from one launch per kernel and message to one `cudaGraphLaunch`. Nothing inside a
capture may allocate, synchronise with the host or read device memory back (CUDA
refuses: "operation not permitted when stream is capturing"); so only calls whose
every step is queued on the device can be captured (docs/gpu.md, "Graph mode").

`capturing()` is true while a call is being captured: the pipelines' time breakdown
(device events around each piece) stands aside then, since events recorded inside a
capture do not time the replays. The backends make the graphs (`Backend.graph()`); this
module holds the one CUDA implementation, through torch (NCCL's calls are torch's), with
cupy's kernels put on torch's capture stream. Imported lazily, on a GPU only.
"""

from __future__ import annotations

from contextlib import contextmanager

_STATE = {"capturing": False}


def capturing() -> bool:
    """Whether a call is being captured into a graph now (on this process)."""
    return _STATE["capturing"]


@contextmanager
def capture_region():
    """Mark the capture of a call (the double and the CUDA graph both)."""
    _STATE["capturing"] = True
    try:
        yield
    finally:
        _STATE["capturing"] = False


class TorchGraph:
    """A CUDA graph of one call, captured on a side stream of torch's; cupy kernels are
    queued on the same stream during the capture (`cupy`), so they are captured too.
    Replays are launched on torch's current stream, where the timing events are."""

    def __init__(self, cupy: bool):
        import torch

        self._torch = torch
        self._graph = torch.cuda.CUDAGraph()
        self._stream = torch.cuda.Stream()
        self._cupy = cupy
        self.replay = self._graph.replay  # the bound method: nothing looked up per replay

    def capture(self, call) -> None:
        torch = self._torch
        torch.cuda.synchronize()  # the eager warm-up's work, before the capture begins
        with capture_region(), torch.cuda.graph(self._graph, stream=self._stream):
            if self._cupy:
                import cupy

                with cupy.cuda.ExternalStream(self._stream.cuda_stream):
                    call()
            else:
                call()
        torch.cuda.synchronize()
