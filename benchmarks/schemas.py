"""The schemas: each kind of result row's columns in order, and each variant's own.

Every CSV the suite writes holds rows of one *kind* (benchmarks/results.py reads and
writes them). This module declares each kind's `Schema` (harness, compare, codec,
training, mgwfbp, costfit, replay, profile, staging), its version, the columns an older
version's rows lacked and the signature that tells a version-1 file; and, for the
harness's open rows, one table per variant (`VariantColumns`) of the columns that
variant adds after the declared ones. It is the one place a column's role and type are
said: the results model's identity, the plots' numbers and the readers' defaults all
come from it. What a column, a role and a schema are is benchmarks/schema_model.py.
Plain data: it imports nothing of ccbench but that model, so every reader may import it
without starting MPI.
"""

from __future__ import annotations

from ccbench.benchmarks.schema_model import (
    DERIVED,
    MEASUREMENT,
    PROVENANCE,
    SCHEMA,
    SETTING,
    Schema,
    VariantColumns,
    columns,
)

RUN = ("run_id", "sweep_id", "timestamp")
WHERE = ("mpi_library", "hostname", "git_sha")

# --------------------------------------------------------------- the harness's variants

# compressed_base.py: what both compressed variants write (the time breakdown of a call)
COMPRESSED = columns(
    (SETTING, int, ("compressions",)),  # encode/decode round trips on the worst path
    (
        MEASUREMENT,
        float,
        (
            "call_us",
            "encode_us",
            "decode_us",
            "reduce_us",
            "wait_us",
            "idle_us",
            "codec_cpu_us",
            "stage_us",
            "wire_floor_us",
            "codec_floor_us",
            "floor_us",
            "overlap_efficiency",
            "floor_link_gbps",
        ),
    ),
    (SETTING, float, ("ranks_per_core", "ranks_per_device")),
    # --hierarchy node or leader only (benchmarks/hierarchy.py): the node layout, the bytes
    # sent at each level and through a node's link, each level's floor and measured time,
    # the intra-node rate; how the level inside a node moves its bytes (ring, shm), and
    # whether it runs after the level across or beside it (levels: series, overlapped)
    (SETTING, int, ("ranks_per_node",)),
    (SETTING, str, ("intra_node", "levels")),
    (MEASUREMENT, int, ("intra_wire_bytes", "inter_wire_bytes", "node_link_bytes")),
    (MEASUREMENT, float, ("intra_floor_us", "inter_floor_us")),
    (MEASUREMENT, float, ("intra_us", "inter_us")),  # each level's measured time
    (MEASUREMENT, float, ("intra_node_gbps",)),
)
P2P_COMPRESSED = VariantColumns(
    "p2p_compressed", (*COMPRESSED, *columns((SETTING, int, ("threshold_bytes",))))
)
COLL_COMPRESSED = VariantColumns(
    "coll_compressed",
    (
        *COMPRESSED,
        *columns(
            (SETTING, str, ("chunk_bytes",)),  # bytes, or "auto"
            (MEASUREMENT, int, ("chunk_used_bytes",)),
            (
                MEASUREMENT,
                float,
                (
                    "auto_codec_gbps",
                    "transport_message_us",
                    "pipeline_chunk_us",
                    "transport_gbps",
                    "auto_link_gbps",
                    "launch_us",  # --chunk-bytes auto on a device: host time per launch
                ),
            ),
            (SETTING, str, ("progress",)),
            (SETTING, int, ("codec_threads",)),
            (SETTING, str, ("wait",)),
            (SETTING, bool, ("fused", "async_progress")),
        ),
    ),
)
SPARSE_STREAMING = VariantColumns(
    "sparse_streaming",
    columns(
        (SETTING, int, ("block_size", "fusion")),
        (SETTING, str, ("protocol",)),
        (SETTING, int, ("slots", "window", "streams")),
        (SETTING, str, ("overlap",)),
        (SETTING, float, ("threshold",)),
        (SETTING, int, ("aggregators",)),
        (MEASUREMENT, float, ("nonzero_density", "union_density")),
        (MEASUREMENT, int, ("wire_min_bytes_per_rank",)),
        (MEASUREMENT, float, ("wire_vs_min", "dropped_mass", "dropped_mass_rel")),
        (SETTING, float, ("density",)),  # its configurations' axis
    ),
)
# the baseline writes only the declared columns (its algorithm and codec among them)
VARIANT_TABLES = (P2P_COMPRESSED, COLL_COMPRESSED, SPARSE_STREAMING)

# --------------------------------------------------------------- the kinds of rows

HARNESS = Schema(
    "harness",
    6,
    columns(
        (PROVENANCE, str, (SCHEMA, *RUN)),
        (
            SETTING,
            str,
            (
                "variant",
                "algorithm",
                "collective",
                "codec",
                "dtype",
                "buffer",
                "transport",
                "backend",
            ),
        ),
        (SETTING, int, ("ranks", "nodes", "size_bytes")),
        (DERIVED, int, ("bytes_per_rank", "total_bytes", "count")),
        (MEASUREMENT, int, ("iterations", "warmup")),
        (SETTING, str, ("timing", "timer", "barrier", "hugepages")),
        (SETTING, int, ("cuda_graph",)),  # replays per timed iteration; 0: eager calls
        (SETTING, float, ("ci_target_pct", "time_budget_s")),
        (MEASUREMENT, str, ("stopped_by",)),
        (
            MEASUREMENT,
            float,
            (
                "avg_us",
                "min_us",
                "max_us",
                "p50_us",
                "p99_us",
                "fastest_us",
                "ci_low_us",
                "ci_high_us",
                "algbw_gbps",
                "busbw_gbps",
            ),
        ),
        (MEASUREMENT, int, ("wire_bytes_per_rank",)),
        (MEASUREMENT, float, ("compression_ratio", "host_syncs")),
        (SETTING, str, ("data",)),
        (MEASUREMENT, float, ("rel_l2_err", "max_abs_err", "max_rel_err", "psnr_db", "cosine")),
        (MEASUREMENT, str, ("validation",)),
        (MEASUREMENT, float, ("validation_err", "error_bound")),
        (SETTING, float, ("link_gbps",)),
        (PROVENANCE, float, ("link_ceiling_gbps",)),
        (PROVENANCE, int, ("link_burst_bytes",)),
        (PROVENANCE, float, ("link_step_us",)),
        (PROVENANCE, str, (*WHERE, "device")),
        defaults={"codec": "none", "dtype": "float32", "buffer": "numpy"},
    ),
    variants=VARIANT_TABLES,
    signature=("variant", "collective", "size_bytes"),
    defaults={
        1: {
            # numpy's own default paging: huge pages advised for large arrays
            "hugepages": "madvise"
        },
        2: {
            # before the torch transport every row ran over MPI
            "transport": "mpi",
            "backend": "mpi",
        },
        3: {
            # before `cluster selfcheck` measured the fixed cost of a ring step: none known
            "link_step_us": ""
        },
        4: {
            # before --cuda-graph every call was launched eagerly
            "cuda_graph": 0
        },
        5: {
            # before the yielding barrier every barrier between timed calls was the
            # transport's own
            "barrier": "blocking"
        },
    },
    variant_defaults={
        1: {
            # sparse-streaming rows of version 1 left out what their defaults were
            "sparse_streaming": {
                "block_size": 256,
                "fusion": 1024,
                "overlap": "random",
                "threshold": 0.0,
                "aggregators": 0,
            }
        }
    },
)

COMPARE = Schema(
    "compare",
    3,
    columns(
        (PROVENANCE, str, (SCHEMA, "compare_id", "sweep_id", "timestamp")),
        (SETTING, str, ("a", "b", "a_rev", "b_rev", "collective")),
        (SETTING, int, ("ranks", "size_bytes")),
        (SETTING, str, ("config", "statistic")),
        (MEASUREMENT, int, ("rounds",)),
        (MEASUREMENT, float, ("a_us", "b_us", "ratio", "ratio_low", "ratio_high")),
        (SETTING, float, ("margin",)),
        (MEASUREMENT, str, ("verdict",)),
        (MEASUREMENT, int, ("a_iterations", "b_iterations")),
        (SETTING, float, ("link_gbps",)),
        (PROVENANCE, float, ("load_start", "load_end")),
        (PROVENANCE, str, ("hostname", "git_sha")),
        (SETTING, str, ("pairing",)),
        (SETTING, int, ("turns",)),
        (SETTING, float, ("ci_target_pct",)),
        (SETTING, str, ("timer",)),
        (MEASUREMENT, str, ("validation",)),
        (SETTING, str, ("barrier",)),
        defaults={"statistic": "avg"},
    ),
    signature=("compare_id", "ratio", "ratio_low", "ratio_high"),
    defaults={
        1: {"statistic": "avg", "timer": "", "validation": ""},
        # before the rows said which barrier ran between timed calls: not known
        2: {"barrier": ""},
    },
)

CODEC = Schema(
    "codec",
    3,
    columns(
        (PROVENANCE, str, (SCHEMA, *RUN)),
        (SETTING, str, ("codec", "kernels")),
        (SETTING, bool, ("lossless",)),
        (SETTING, str, ("data", "dtype", "buffer", "hugepages")),
        (SETTING, int, ("size_bytes",)),
        (MEASUREMENT, int, ("repeats",)),
        (SETTING, str, ("clock",)),
        (SETTING, int, ("cuda_graph",)),  # replays per timed batch; 0: eager calls
        (MEASUREMENT, float, ("host_us_per_call",)),  # an eager call's host time
        (
            MEASUREMENT,
            float,
            (
                "encode_gbps",
                "decode_gbps",
                "hop_gbps",
                "copy_gbps",
                "encode_vs_copy",
                "decode_vs_copy",
                "hop_vs_copy",
                "ratio",
                "max_abs_err",
                "max_rel_err",
                "rel_l2_err",
                "psnr_db",
                "cosine",
                "error_bound",
            ),
        ),
        (PROVENANCE, str, ("hostname", "git_sha")),
        defaults={"data": "random"},
    ),
    signature=("encode_gbps", "decode_gbps"),
    defaults={
        1: {"data": "random", "kernels": "reference", "hugepages": "madvise"},
        2: {"cuda_graph": 0},  # before --cuda-graph (no host time per call was measured)
    },
)

TRAINING = Schema(
    "training",
    3,
    columns(
        (PROVENANCE, str, (SCHEMA, *RUN)),
        (SETTING, str, ("row", "framework", "variant", "algorithm", "codec", "compress")),
        (SETTING, int, ("error_feedback", "overlap")),  # 0 or 1 (overlap: stock PyTorch's)
        (SETTING, str, ("strategy", "model", "dataset", "transport", "backend")),
        (MEASUREMENT, int, ("params",)),
        (SETTING, int, ("ranks", "nodes", "global_batch")),
        (SETTING, float, ("lr",)),
        (SETTING, int, ("seed", "steps", "warmup_steps", "final_window", "step")),
        (
            MEASUREMENT,
            float,
            (
                "loss",
                "step_us",
                "compute_us",
                "comm_us",
                "forward_us",
                "backward_us",
                "optimizer_us",
                "allgather_us",
                "reduce_scatter_us",
                "allreduce_us",
                "comm_busy_us",
                "predicted_us",
                "predicted_exposed_us",
            ),
        ),
        (MEASUREMENT, int, ("groups",)),
        (MEASUREMENT, float, ("max_step_us",)),
        (MEASUREMENT, int, ("wire_bytes_per_rank",)),
        (MEASUREMENT, float, ("throughput",)),
        (MEASUREMENT, str, ("throughput_unit",)),
        (MEASUREMENT, float, ("held_out_loss", "held_out_accuracy")),
        (SETTING, float, ("link_gbps",)),
        (PROVENANCE, str, (*WHERE, "device")),
        defaults={"row": "step"},
    ),
    signature=("step", "loss", "step_us"),
    defaults={
        1: {
            # the training loop's warm-up and final-loss window before rows recorded them
            "warmup_steps": 3,
            "final_window": 10,
            "framework": "own",
            "row": "step",
        },
        2: {
            # before the torch transport ccbench's collectives all ran over MPI
            "transport": "mpi",
            "backend": "mpi",
        },
    },
)

MGWFBP = Schema(
    "mgwfbp",
    2,
    columns(
        (PROVENANCE, str, (SCHEMA, *RUN)),
        (SETTING, str, ("variant", "model", "strategy")),
        (SETTING, int, ("ranks", "nodes")),
        (SETTING, str, ("transport",)),
        (
            MEASUREMENT,
            float,
            (
                "measured_us",
                "measured_std_us",
                "predicted_us",
                "forward_us",
                "backward_us",
                "measured_backward_us",
                "nonoverlapped_us",
                "measured_nonoverlapped_us",
                "comm_us",
                "measured_comm_us",
                "scaling_efficiency",
            ),
        ),
        (MEASUREMENT, int, ("groups",)),
        (MEASUREMENT, str, ("plan",)),
        (MEASUREMENT, int, ("tensors", "total_bytes")),
        (MEASUREMENT, float, ("alpha_us", "beta_us_per_byte", "fit_r2")),
        (SETTING, float, ("link_gbps", "hop_latency_us")),
        (SETTING, str, ("algorithm",)),
        (SETTING, float, ("compute_speedup",)),
        (MEASUREMENT, int, ("iterations",)),
        (MEASUREMENT, str, ("validation",)),
        (PROVENANCE, str, WHERE),
    ),
    signature=("model", "strategy", "predicted_us"),
    defaults={1: {"transport": "", "variant": ""}},
)

COSTFIT = Schema(
    "costfit",
    2,
    columns(
        (PROVENANCE, str, (SCHEMA, "run_id", "sweep_id")),
        (SETTING, str, ("model",)),
        (SETTING, int, ("ranks",)),
        (SETTING, str, ("transport",)),
        (SETTING, float, ("link_gbps",)),
        (SETTING, int, ("size_bytes",)),
        (MEASUREMENT, float, ("measured_us", "fitted_us")),
        (MEASUREMENT, int, ("iterations",)),
    ),
    signature=("size_bytes", "measured_us", "fitted_us"),
    defaults={1: {"model": "", "transport": ""}},
)

REPLAY = Schema(
    "replay",
    2,
    columns(
        (PROVENANCE, str, (SCHEMA, *RUN)),
        (
            SETTING,
            str,
            (
                "row",
                "trace",
                "trace_id",
                "source",
                "framework",
                "model",
                "variant",
                "algorithm",
                "codec",
                "compress",
                "merge",
                "compute_wait",
            ),
        ),
        (SETTING, float, ("compute_scale",)),
        (SETTING, str, ("data",)),
        (SETTING, int, ("ranks", "nodes", "traced_ranks", "steps", "warmup_steps", "step")),
        (DERIVED, int, ("trace_step", "calls", "step_bytes")),
        (DERIVED, float, ("traced_compute_us", "traced_step_us")),
        (
            MEASUREMENT,
            float,
            (
                "step_us",
                "step_ci_low_us",
                "step_ci_high_us",
                "compute_us",
                "comm_us",
                "codec_us",
                "exposed_codec_us",
                "allgather_us",
                "reduce_scatter_us",
                "allreduce_us",
                "comm_busy_us",
                "emulated_us",
                "max_step_us",
            ),
        ),
        (MEASUREMENT, int, ("wire_bytes_per_rank",)),
        (MEASUREMENT, str, ("validation",)),
        (SETTING, float, ("link_gbps",)),
        (PROVENANCE, str, WHERE),
        defaults={"row": "step"},
    ),
    signature=("trace_id", "traced_compute_us", "step_us"),
)

PROFILE = Schema(
    "profile",
    2,
    columns(
        (PROVENANCE, str, (SCHEMA,)),
        (SETTING, str, ("model",)),
        (SETTING, int, ("order",)),
        (SETTING, str, ("param", "shape")),
        (SETTING, int, ("numel",)),
        (SETTING, str, ("dtype",)),
        (SETTING, int, ("bytes",)),
        (MEASUREMENT, float, ("backward_us", "ready_us", "forward_us")),
        (SETTING, int, ("batch", "width")),
        (SETTING, str, ("device",)),
        (MEASUREMENT, int, ("iterations",)),
    ),
    signature=("order", "bytes", "backward_us"),
)

# benchmarks/staging_bound.py: a staged device allgather against its parts, one row per
# size. Version 1 had no schema column (its files are told by their columns).
STAGING = Schema(
    "staging",
    2,
    columns(
        (PROVENANCE, str, (SCHEMA,)),
        (SETTING, str, ("buffer",)),
        (SETTING, int, ("size_bytes", "ranks")),
        (
            MEASUREMENT,
            float,
            (
                "d2h_pinned_us",
                "host_allgather_us",
                "h2d_pinned_us",
                "bound_us",
                "staged_us",
                "staged_vs_bound",
                "staged_whole_us",
            ),
        ),
        (SETTING, int, ("rounds", "stage_chunk_bytes")),
        (PROVENANCE, str, ("device",)),
    ),
    signature=("d2h_pinned_us", "host_allgather_us", "bound_us"),
)

# In the order a version-1 file is told by its columns: the first whose signature the
# header carries (a harness header also carries a compare's size_bytes, say).
SCHEMAS = (REPLAY, TRAINING, MGWFBP, COSTFIT, PROFILE, CODEC, COMPARE, STAGING, HARNESS)
BY_KIND = {schema.kind: schema for schema in SCHEMAS}

# The harness columns every micro-benchmark row carries, in order (variants add theirs).
COMMON_COLUMNS = HARNESS.names
MGWFBP_COLUMNS = MGWFBP.names
