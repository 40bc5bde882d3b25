"""stdout in OSU Micro-Benchmarks 7.4's own format, so OSU parsers keep working.

OSU prints the size left-aligned in 10 characters and each number right-aligned in 18
with two decimals, iterations in 12; ccbench's extra columns come only after OSU's.
"""

from __future__ import annotations

from ccbench.collectives.spec import spec

OSU_VERSION = "7.4"
SIZE_WIDTH, FIELD_WIDTH, ITER_WIDTH, PRECISION = 10, 18, 12, 2

MPI_DATATYPES = {
    "float32": "MPI_FLOAT",
    "float64": "MPI_DOUBLE",
    "float16": "MPIX_C_FLOAT16",
    "bfloat16": "bfloat16 (no MPI type)",
    "int8": "MPI_SIGNED_CHAR",
}


def title(collective: str) -> str:
    return f"# OSU MPI {spec(collective).osu_title} Latency Test v{OSU_VERSION}"


def _fmt(value, form: str, width: int) -> str:
    if value is None or value == "" or (isinstance(value, float) and value != value):
        return f"{'-':>{width}}"
    return f"{value:>{width}{form}}"


class Printer:
    """Prints the header and one line per size on rank 0."""

    def __init__(self, opts, variant, info: dict):
        self.opts, self.variant, self.info = opts, variant, info
        self.extra = list(variant.stdout_columns(opts))
        if opts.full:
            self.extra = [
                ("P50 Latency(us)", "p50_us", ".2f"),
                ("P99 Latency(us)", "p99_us", ".2f"),
                ("Fastest(us)", "fastest_us", ".2f"),
                ("CI95 Low(us)", "ci_low_us", ".2f"),
                ("CI95 High(us)", "ci_high_us", ".2f"),
                ("Busbw(GB/s)", "busbw_gbps", ".3f"),
                *self.extra,
            ]

    def header(
        self, skipped: list[int], ranks: int, timer_note: str = "", barrier_note: str = ""
    ) -> None:
        opts, columns = self.opts, self.variant.columns(self.opts)
        lines = [title(opts.collective), f"# Datatype: {MPI_DATATYPES[opts.dtype]}."]
        described = ", ".join(f"{k} {v}" for k, v in columns.items() if v is not None)
        lines.append(f"# ccbench {self.variant.name}" + (f": {described}" if described else ""))
        alone = " (one rank: no data moves; start it under mpiexec)" if ranks == 1 else ""
        transport = getattr(opts, "transport", "mpi")
        over = f"; transport torch ({opts.backend})" if transport == "torch" else ""
        library = self.info["mpi_library"] or "MPI not started"
        devices = self.info.get("device", "")
        where = f" on {devices}" if devices and set(devices.split(",")) != {"cpu"} else ""
        lines.append(
            f"# {library}{over}; {ranks} rank{'s' * (ranks != 1)}{alone}; "
            f"buffer {opts.buffer}{where}; timing {opts.timing}"
        )
        timer = getattr(opts, "timer", "")
        if timer:
            lines.append(f"# Timer: {timer}, {timer_note}")
        barrier = getattr(opts, "barrier", "")
        if barrier:
            lines.append(f"# Barrier between calls: {barrier}, {barrier_note}")
        if getattr(opts, "data_note", None):
            lines.append(f"# Data: {opts.data_note}")
        lines.append(f"# Convention: {spec(opts.collective).size_convention}")
        if skipped:
            lines.append(
                f"# Skipped sizes too small for one element per rank: "
                f"{', '.join(map(str, skipped))}"
            )
        head = f"{'# Size':<{SIZE_WIDTH}}{'Avg Latency(us)':>{FIELD_WIDTH}}"
        if opts.full:
            head += f"{'Min Latency(us)':>{FIELD_WIDTH}}{'Max Latency(us)':>{FIELD_WIDTH}}"
            head += f"{'Iterations':>{ITER_WIDTH}}"
        if opts.validate:
            head += f"{'Validation':>{FIELD_WIDTH}}"
        for name, _, _ in self.extra:
            head += f"{name:>{FIELD_WIDTH}}"
        lines.append(head)
        print("\n".join(lines), flush=True)

    def row(self, row: dict) -> None:
        line = f"{row['size_bytes']:<{SIZE_WIDTH}d}{row['avg_us']:>{FIELD_WIDTH}.{PRECISION}f}"
        if self.opts.full:
            line += f"{row['min_us']:>{FIELD_WIDTH}.{PRECISION}f}"
            line += f"{row['max_us']:>{FIELD_WIDTH}.{PRECISION}f}"
            line += f"{row['iterations']:>{ITER_WIDTH}d}"
        if self.opts.validate:
            line += f"{row['validation']:>{FIELD_WIDTH}}"
        for _, key, form in self.extra:
            line += _fmt(row.get(key), form, FIELD_WIDTH)
        print(line, flush=True)
