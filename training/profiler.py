"""Per-tensor gradient sizes and backward times of a model, measured with gradient hooks.

A hook on every parameter (``register_post_accumulate_grad_hook``) stamps the time its
gradient is ready (after a device sync when the model is on a GPU). Over ``iterations``
timed iterations after ``warmup``, the gaps between consecutive stamps (the first from
the end of the forward pass) are averaged per tensor (``statistic`` mean or median).
Rows come in backward order, with ``collectives.mgwfbp.PROFILE_COLUMNS``, so the planner
and the simulator read them without torch.
"""

from __future__ import annotations

import time

import numpy as np

from ccbench.kernels.errors import UsageError


def _sync(device) -> None:
    if device.type == "cuda":
        import torch

        torch.cuda.synchronize(device)


def profile_model(name: str, width: float | None = None, batch: int | None = None,
                  warmup: int = 3, iterations: int = 10, device: str = "cpu",
                  seed: int = 0, statistic: str = "mean", on_iteration=None) -> list[dict]:
    """Profile rows of one model, in backward order (see module docstring).

    ``on_iteration()`` is called after every iteration, warm-ups included.
    """
    import torch

    from ccbench.training.profile_models import loss_of, model_spec

    spec = model_spec(name)
    width = spec.width if width is None else width
    batch = spec.batch if batch is None else batch
    dev = torch.device(device)
    torch.manual_seed(seed)
    model = spec.build(width).to(dev)
    generator = torch.Generator().manual_seed(seed)
    inputs, targets = (t.to(dev) for t in spec.make_batch(batch, generator))
    params = dict(model.named_parameters())
    names = {id(p): n for n, p in params.items()}
    stamps: list[tuple[str, int]] = []

    def hook(p):
        _sync(dev)
        stamps.append((names[id(p)], time.perf_counter_ns()))

    handles = [p.register_post_accumulate_grad_hook(hook) for p in params.values()]
    gaps = {n: [] for n in params}
    forward_ns, order = [], None
    try:
        for it in range(warmup + iterations):
            model.zero_grad(set_to_none=True)
            _sync(dev)
            t0 = time.perf_counter_ns()
            loss = loss_of(model, inputs, targets)
            _sync(dev)
            t1 = time.perf_counter_ns()
            stamps.clear()
            loss.backward()
            if on_iteration is not None:
                on_iteration()
            if it < warmup:
                continue
            seen = [n for n, _ in stamps]
            if len(seen) != len(params):
                raise UsageError(f"{name}: {len(params) - len(seen)} parameters got no gradient")
            if order is None:
                order = seen
            forward_ns.append(t1 - t0)
            previous = t1
            for n, t in stamps:
                gaps[n].append(t - previous)
                previous = t
    finally:
        for h in handles:
            h.remove()
    if iterations < 1 or order is None:
        raise UsageError("need at least one timed iteration")
    average = {"mean": np.mean, "median": np.median}[statistic]
    forward_us = float(average(forward_ns)) / 1e3
    rows, ready = [], 0.0
    for i, n in enumerate(order):
        p = params[n]
        backward_us = float(average(gaps[n])) / 1e3
        ready += backward_us
        rows.append({
            "model": name, "order": i, "param": n, "shape": "x".join(map(str, p.shape)),
            "numel": p.numel(), "dtype": str(p.dtype).removeprefix("torch."),
            "bytes": p.numel() * p.element_size(), "backward_us": round(backward_us, 3),
            "ready_us": round(ready, 3), "forward_us": round(forward_us, 3), "batch": batch,
            "device": dev.type, "iterations": iterations, "width": width,
        })  # fmt: skip
    return rows
