"""What both compressed variants share: the codec option, inputs, error bounds, row stats.

A shared base beside the harness (nccl-tests' shape): `p2p_compressed` and
`coll_compressed` each only say which schedule they run and their own options.
"""

from __future__ import annotations

import os

import numpy as np

from ccbench.benchmarks import graphs
from ccbench.benchmarks.environment import link_bound
from ccbench.benchmarks.harness import Op, Variant, held
from ccbench.benchmarks.hierarchy import (
    LEVEL_COLUMNS,
    add_hierarchy_options,
    bind_hierarchical,
    check_hierarchy,
    hierarchical_algorithm,
    is_hierarchical,
    level_columns,
)
from ccbench.benchmarks.options import add_compression, compression_from, iterations_for
from ccbench.benchmarks.schemas import COMPRESSED
from ccbench.collectives.compressed import bind_compressed
from ccbench.collectives.compressed_error import (
    compressions_on_path,
    error_bound,
    hierarchical_error_bound,
)
from ccbench.collectives.costmodel import floor_steps, pipeline_floor
from ccbench.collectives.hierarchical import ranks_per_node_from_environment
from ccbench.collectives.pipeline import CODEC_CPU, FIELDS
from ccbench.kernels import arrays, inputs, switches
from ccbench.kernels.vocabulary import COLLECTIVES

DEFAULT_CODEC = "fp16"


class CompressedVariant(Variant):
    """What both compressed variants share: the codec, inputs, bounds and row stats."""

    kind = ""  # the collectives.compressed schedule: "p2p", "coll" or "library"
    algorithm = "ring"  # the row's `algorithm`
    collectives = COLLECTIVES
    chunked: dict = {}  # add_compression's chunk options: the pipelined schedule's

    def __init__(self):
        self.compression = None  # the parsed --codec (and --chunk-bytes), check_options
        self.codec = None
        self.ranks = 1
        self.hierarchical = False
        self.layout = None  # hierarchical: the node layout, once a collective is bound

    def add_options(self, parser) -> None:
        group = parser.add_argument_group("compression")
        add_compression(
            group, default=DEFAULT_CODEC, codec_help="codec spec; see above", **self.chunked
        )
        self.add_variant_options(group)
        add_hierarchy_options(parser)

    def add_variant_options(self, group) -> None:
        """The variant's own options, in the compression group."""

    def check_options(self, opts, ranks: int) -> None:
        self.ranks = ranks
        self.compression = self.setting(opts)
        self.codec = self.compression.codec
        self.codec.check_supported(opts.buffer, opts.dtype)
        check_hierarchy(opts, ranks)
        self.hierarchical = is_hierarchical(opts)
        self.ranks_per_node = opts.ranks_per_node

    def setting(self, opts):
        """The run's compression setting, parsed once per parse of the options (the data
        kind asks before check_options does)."""
        if getattr(opts, "compression", None) is None:
            opts.compression = self.parse_compression(opts)
        return opts.compression

    def parse_compression(self, opts):
        return compression_from(opts)

    def options(self, opts, case) -> dict:
        """Keyword options of the bound collective for this case."""
        return {}

    def values_matter(self, opts) -> bool:
        return self.setting(opts).codec.name != "none"

    def columns(self, opts) -> dict:
        # compressions: encode/decode round trips on the worst element's path (across
        # nodes only, where hierarchical: nothing is compressed inside a node)
        ranks = self.ranks
        per_node = opts.ranks_per_node or ranks_per_node_from_environment()
        if self.hierarchical and per_node:
            ranks //= per_node
        return {
            "algorithm": hierarchical_algorithm(opts, self.algorithm),
            "codec": self.codec.spec,
            "compressions": compressions_on_path(self.kind, opts.collective, ranks),
            **dict.fromkeys(BREAKDOWN_COLUMNS),
            **dict.fromkeys(LEVEL_COLUMNS),
        }  # each row's values come from `stats`

    def stdout_columns(self, opts) -> list[tuple[str, str, str]]:
        columns = [("Ratio", "compression_ratio", ".3f")]
        if self.codec.lossy:
            columns.append(("MaxRelErr", "max_rel_err", ".3e"))
        return columns

    def make_op(self, ctx, case) -> Op:
        comm = ctx.comm
        send = arrays.empty(case.buffer, case.send_count, case.dtype)
        recv = arrays.empty(case.buffer, case.recv_count, case.dtype)
        options = self.options(ctx.opts, case)
        if self.hierarchical:

            def bind_inter(inter, s, r):
                return bind_compressed(
                    inter, self.kind, case.collective, self.codec, s, r, **options
                )

            run = bind_hierarchical(comm, ctx.opts, case.collective, send, recv, bind_inter)
            self.layout = run.layout
        else:
            run = bind_compressed(
                comm, self.kind, case.collective, self.codec, send, recv, **options
            )
        warmup = iterations_for(case.size_bytes, ctx.opts)[1]

        def stats() -> dict:
            # the harness ran one more call just before and left its bytes in the counter
            raw = comm.allreduce_value(run.raw_bytes)
            wire = comm.allreduce_value(comm.wire_bytes)
            row = {"compression_ratio": raw / wire if wire else float("nan")}
            if "chunk_bytes" in options:  # what --chunk-bytes auto chose for this size
                row["chunk_used_bytes"] = options["chunk_bytes"]
            if ctx.opts.cuda_graph:  # replays run no Python: no breakdown to read
                return row
            # the timed calls: after the warm-up, before the harness's untimed last call
            timed = (warmup, -1)
            row.update(
                breakdown_columns(
                    comm,
                    run.breakdown.mean(*timed),
                    comm.wire_bytes,
                    case.collective,
                    case.buffer,
                    run.breakdown.fastest(*timed)[CODEC_CPU],
                )
            )
            if self.hierarchical:  # the two levels' bytes, and their floor
                row.update(level_columns(comm, run, case.collective, self.algorithm, row, timed))
            return row

        return Op(run=run, send=send, recv=recv, stats=stats, check=self.codec.check_deferred)

    def graph_refusal(self, opts) -> str | None:
        return graphs.codec_refusal(self.codec, opts.buffer, opts.dtype)

    def validation_input(self, case, rank: int) -> np.ndarray:
        # a lossy codec is exact on small integers, which would leave its bound untested:
        # it is validated on values spread over many magnitudes, against that bound
        kind = "gradient-like" if self.codec.lossy else "exact"
        return inputs.values(kind, case.send_count, rank, case.ranks, case.seed)

    def error_bound(self, case, reference, inputs) -> float | None:
        if not self.codec.lossy:
            return None
        amaxes = [float(np.abs(held(x, case.dtype)).max()) if x.size else 0.0 for x in inputs]
        if self.hierarchical:
            return hierarchical_error_bound(
                self.codec,
                self.kind,
                case.collective,
                amaxes,
                case.dtype,
                self.layout.ranks_per_node,
            )
        return error_bound(self.codec, self.kind, case.collective, amaxes, case.dtype)


# The time breakdown of the timed calls ---------------------------------------------------

# the columns both compressed variants' schema tables declare (benchmarks/schemas.py), in
# their order, except `compressions` (a value of the run, not of each call)
BREAKDOWN_COLUMNS = tuple(
    c.name for c in COMPRESSED if c.name != "compressions" and c.name not in LEVEL_COLUMNS
)


def floor_link_gbps() -> float | None:
    """The link's payload rate for the floor (`ccbench cluster run` sets them): the TCP
    ceiling of the shaped rate, the fastest the shaper lets payload through, else the
    goodput `ccbench cluster selfcheck` measured, else the configured rate; None off an
    emulated link."""
    given = switches.current()
    for value in (given.link_ceiling_gbps, given.link_goodput_gbps, given.link_gbps):
        if value:
            return float(value)
    return None


def codec_share(places: list, critical: int, on_device: bool) -> tuple[float, float | None]:
    """(ranks per core, ranks per device) around the critical rank, from every rank's
    place (host, cores of its affinity mask, device or None). On a device the codec's
    share is the ranks on the same host with the same device; on the host, the ranks on
    its host over the distinct cores their masks cover."""
    host, _, device = places[critical]
    same_host = [p for p in places if p[0] == host]
    cores = len({core for _, affinity, _ in same_host for core in affinity}) or 1
    per_core = len(same_host) / cores
    if not on_device:
        return per_core, None
    return per_core, float(sum(1 for p in same_host if p[2] == device))


def rank_device(buffer: str):
    """What tells this rank's device from another's on the same host (None on the host)."""
    if not arrays.is_gpu(buffer):
        return None
    return tuple(sorted(arrays.backend(buffer).describe().items()))


def sharing_ranks(places: list, critical: int, on_device: bool) -> list[int]:
    """The ranks whose codec work shares the critical rank's cores (the same host) or,
    on a device, its device."""
    host, _, device = places[critical]
    return [r for r, (h, _, d) in enumerate(places) if h == host and (not on_device or d == device)]


def breakdown_columns(
    comm,
    mean,
    wire_bytes: int,
    collective: str,
    buffer: str = "numpy",
    fastest_codec_s: float | None = None,
) -> dict:
    """The breakdown on the critical rank (the one whose calls took longest), its floor
    (costmodel.pipeline_floor) and the overlap efficiency (call time over floor). `mean`
    is this rank's per-call mean of pipeline.FIELDS in seconds (device time on a device:
    codec_cpu is then the codec kernels' time, shared by the ranks on its device);
    `fastest_codec_s` its least codec time of one timed call (default: the mean's), which
    the codec's floor takes from every rank sharing the critical rank's cores or device
    (costmodel.codec_floor_s); `wire_bytes` what it sent in one call. Collective."""
    on_device = arrays.is_gpu(buffer)
    where = (comm.processor_name(), sorted(os.sched_getaffinity(0)), rank_device(buffer))
    fastest = float(mean[CODEC_CPU] if fastest_codec_s is None else fastest_codec_s)
    everyone = comm.allgather_obj((list(map(float, mean)), int(wire_bytes), where, fastest))
    critical = max(range(len(everyone)), key=lambda r: everyone[r][0][0])
    values, sent, _, _ = everyone[critical]
    places = [w for _, _, w, _ in everyone]
    per_core, per_device = codec_share(places, critical, on_device)
    sharing = [everyone[r][3] for r in sharing_ranks(places, critical, on_device)]
    got = dict(zip(FIELDS, values, strict=True))
    link = floor_link_gbps()
    bound = link_bound()
    floor = pipeline_floor(
        sent,
        link * 1e9 if link else None,
        sharing,
        per_device if on_device else per_core,
        bound["link_burst_bytes"] or 0.0,
        floor_steps(collective, len(everyone)),
        (bound["link_step_us"] or 0.0) * 1e-6,
    )
    busy = got["encode"] + got["decode"] + got["reduce"] + got["wait"] + got["stage"]
    us = 1e6
    return {
        "call_us": got["call"] * us,
        "encode_us": got["encode"] * us,
        "decode_us": got["decode"] * us,
        "reduce_us": got["reduce"] * us,
        "wait_us": got["wait"] * us,
        "idle_us": max(0.0, got["call"] - busy) * us,
        "codec_cpu_us": got["codec_cpu"] * us,
        "stage_us": got["stage"] * us,
        "wire_floor_us": floor["wire"] * us if floor["wire"] is not None else None,
        "codec_floor_us": floor["codec"] * us,
        "floor_us": floor["floor"] * us,
        "overlap_efficiency": got["call"] / floor["floor"] if floor["floor"] > 0 else None,
        "floor_link_gbps": link,
        "ranks_per_core": per_core,
        "ranks_per_device": per_device,
    }
