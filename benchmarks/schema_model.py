"""What a schema is: a row's columns, each with its role and its type, and the schema itself.

Every CSV the suite writes holds rows of one *kind*; each kind has a `Schema`, its columns
in CSV order, each a `Column` with a *role*:

* a **setting** says which point was measured and how (variant, codec, size, ranks,
  timer, data ...): rows that agree on every setting measured the same point;
* a **derived** column follows from the settings (the byte counts of a size);
* a **measurement** is what was measured (times, rates, errors, bytes on the wire, the
  validation verdict, the iterations it took);
* **provenance** says which run made the row and where (`schema`, run and sweep ids,
  time, host, commit, MPI library);

and a *type*, what its text is read as (`str`, `int`, `float`, `bool`; an empty cell is
no value). An *open* schema (the harness's) also holds the columns each variant adds
after the declared ones (`VariantColumns`), and reads a column nobody declared by the rule
an older ccbench wrote it with (`legacy_role`). This module is the machinery only; the
schemas themselves, one per kind and one table per variant, are declared in
benchmarks/schemas.py. Plain data: it imports nothing of ccbench, so every reader may
import it without starting MPI.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import NamedTuple

SETTING, DERIVED, MEASUREMENT, PROVENANCE = "setting", "derived", "measurement", "provenance"
SCHEMA = "schema"  # the first column of every row: "<kind>/<version>"
NUMBER_TYPES = (int, float)


class Column(NamedTuple):
    name: str
    role: str
    type: type  # what its text is read as
    default: object = ""  # what a reader takes for a text setting a row leaves empty


def columns(
    *groups: tuple[str, type, tuple[str, ...]], defaults: Mapping[str, object] | None = None
) -> tuple[Column, ...]:
    """Columns from (role, type, names) groups, in order; `defaults` for text settings a
    row may leave empty (a reader fills them in)."""
    defaults = defaults or {}
    return tuple(
        Column(name, role, kind, defaults.get(name, ""))
        for role, kind, names in groups
        for name in names
    )


@dataclass(frozen=True)
class VariantColumns:
    """The columns one variant writes after its schema's declared ones."""

    variant: str
    columns: tuple[Column, ...]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)


# Before the columns were declared, a variant's own column was a measurement when listed
# here or named with a measurement suffix, and a setting otherwise. Only files an older
# ccbench wrote can hold a column no table in schemas.py declares: they are read by that rule.
LEGACY_MEASURED = frozenset(
    {
        "compression_ratio",
        "error_bound",
        "psnr_db",
        "cosine",
        "nonzero_density",
        "union_density",
        "overlap_efficiency",
        "chunk_used_bytes",
        "wire_min_bytes_per_rank",
        "wire_vs_min",
        "dropped_mass",
        "dropped_mass_rel",
        "min_wire_bytes_per_rank",
        "wire_over_min",
    }
)
LEGACY_SUFFIXES = ("_us", "_gbps", "_err", "_ratio", "_wire_bytes", "_per_rank")


def legacy_role(column: str) -> str:
    """The role an older ccbench gave an undeclared column of an open schema."""
    if column in LEGACY_MEASURED or column.endswith(LEGACY_SUFFIXES):
        return MEASUREMENT
    return SETTING


@dataclass(frozen=True)
class Schema:
    """One kind of row: its columns in order with their roles and types, and its version."""

    kind: str
    version: int
    columns: tuple[Column, ...]  # in CSV order
    # the variants' own columns after the declared ones (an open schema: the harness's)
    variants: tuple[VariantColumns, ...] = ()
    signature: tuple[str, ...] = ()  # columns that tell a version-1 file of this kind
    # per older version: values its rows lacked, as the code then wrote them implicitly
    defaults: Mapping[int, Mapping[str, object]] = field(default_factory=dict)
    # the same, for the rows of one variant only: {version: {variant: {column: value}}}
    variant_defaults: Mapping[int, Mapping[str, Mapping[str, object]]] = field(default_factory=dict)

    @property
    def open(self) -> bool:
        return bool(self.variants)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    @property
    def tag(self) -> str:
        return f"{self.kind}/{self.version}"

    def column(self, name: str) -> Column | None:
        """The declaration of `name`: the schema's, else a variant's."""
        return self._by_name.get(name)

    def known(self) -> tuple[Column, ...]:
        """Every column rows of this kind may hold: the declared ones, then the variants'
        (each name once)."""
        return tuple(self._by_name.values())

    @cached_property
    def _by_name(self) -> dict[str, Column]:
        seen = {c.name: c for c in self.columns}
        for table in self.variants:
            for column in table.columns:
                seen.setdefault(column.name, column)
        return seen

    def role(self, name: str) -> str:
        column = self.column(name)
        if column is not None:
            return column.role
        return legacy_role(name) if self.open else SETTING

    def type(self, name: str) -> type:
        column = self.column(name)
        return column.type if column is not None else str

    def numeric(self) -> tuple[str, ...]:
        """The columns read as numbers."""
        return tuple(c.name for c in self.known() if c.type in NUMBER_TYPES)

    def text_settings(self) -> dict[str, object]:
        """The declared text settings (every row has them) and what a reader takes for one
        a row leaves empty. A variant's own are left empty by the other variants' rows."""
        return {c.name: c.default for c in self.columns if c.role == SETTING and c.type is str}

    def variant_columns(self, variant: str) -> tuple[str, ...]:
        """The columns rows of `variant` may hold a value in."""
        own = [t.names for t in self.variants if t.variant == variant]
        return self.names + tuple(n for names in own for n in names)

    def identity_columns(self, header: Iterable[str]) -> list[str]:
        """The columns of a table with this header that say which point a row measured."""
        return [c for c in header if not c.startswith("_") and self.role(c) == SETTING]

    def extras(self, header: Iterable[str]) -> list[str]:
        """The columns a variant added after the declared ones."""
        declared = set(self.names)
        return [c for c in header if c not in declared]

    def header(self, extras: Iterable[str] = ()) -> list[str]:
        return [*self.names, *(c for c in extras if c not in set(self.names))]
