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


def backward_stamps(
    model, loss_fn, warmup: int = 3, iterations: int = 10, device=None, on_iteration=None
) -> tuple[list[str], np.ndarray, np.ndarray]:
    """Time a model's real backward pass per gradient, with no communication.

    A hook on every trainable parameter stamps when its gradient is ready. Returns the
    parameter names in backward order (of the first timed iteration), the gaps between
    consecutive stamps in ns (``[iteration, tensor]``, the first from the end of the
    forward pass) and the forward times in ns. Gradients are freed before and after.
    """
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    names = {id(p): n for n, p in params.items()}
    stamps: list[tuple[str, int]] = []
    dev = device if device is not None else next(iter(params.values())).device

    def hook(p):
        _sync(dev)
        stamps.append((names[id(p)], time.perf_counter_ns()))

    handles = [p.register_post_accumulate_grad_hook(hook) for p in params.values()]
    gaps, forward_ns, order = [], [], None
    try:
        for it in range(warmup + iterations):
            model.zero_grad(set_to_none=True)
            _sync(dev)
            t0 = time.perf_counter_ns()
            loss = loss_fn(model)
            _sync(dev)
            t1 = time.perf_counter_ns()
            stamps.clear()
            loss.backward()
            if on_iteration is not None:
                on_iteration()
            if it < warmup:
                continue
            ready = dict(stamps)
            if len(ready) != len(params):
                raise UsageError(f"{len(params) - len(ready)} parameters got no gradient")
            order = order or [n for n, _ in stamps]
            forward_ns.append(t1 - t0)
            gaps.append(np.diff([t1, *(ready[n] for n in order)]))
    finally:
        for h in handles:
            h.remove()
        model.zero_grad(set_to_none=True)
    if iterations < 1 or order is None:
        raise UsageError("need at least one timed iteration")
    return order, np.array(gaps, dtype=np.float64), np.array(forward_ns, dtype=np.float64)


def profile_model(
    name: str,
    width: float | None = None,
    batch: int | None = None,
    warmup: int = 3,
    iterations: int = 10,
    device: str = "cpu",
    seed: int = 0,
    statistic: str = "mean",
    on_iteration=None,
) -> list[dict]:
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
    try:
        order, gaps, forward_ns = backward_stamps(
            model, lambda m: loss_of(m, inputs, targets), warmup, iterations, dev, on_iteration
        )
    except UsageError as exc:
        raise UsageError(f"{name}: {exc}") from None
    average = {"mean": np.mean, "median": np.median}[statistic]
    forward_us = float(average(forward_ns)) / 1e3
    backward = average(gaps, axis=0) / 1e3
    rows, ready = [], 0.0
    for i, n in enumerate(order):
        p = params[n]
        backward_us = float(backward[i])
        ready += backward_us
        rows.append(
            {
                "model": name,
                "order": i,
                "param": n,
                "shape": "x".join(map(str, p.shape)),
                "numel": p.numel(),
                "dtype": str(p.dtype).removeprefix("torch."),
                "bytes": p.numel() * p.element_size(),
                "backward_us": round(backward_us, 3),
                "ready_us": round(ready, 3),
                "forward_us": round(forward_us, 3),
                "batch": batch,
                "device": dev.type,
                "iterations": iterations,
                "width": width,
            }
        )
    return rows
