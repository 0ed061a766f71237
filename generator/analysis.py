"""Pattern analysis: how well a sparse matrix fits each kernel family, and
what converting it would cost -- the report `sparseforge inspect` prints.

The statistics of the matrix (rows, columns, imbalance) are computed here;
each family says how the matrix fits its pattern (Family.analyze, in its
package).  Costs are in one unit across families where they can be: the
explicit zeros a family would have to store, as a fraction of the matrix's
nonzeros (0 = fits exactly); a family that cannot store extra entries and
must drop some instead (nm24) says so in its cost.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from .matrix import SparseMatrix


def stats(a: np.ndarray) -> tuple[float, float, float, float]:
    """(min, mean, max, cv) of a vector; cv = std / mean (0 for mean 0)."""
    a = np.asarray(a, dtype=np.float64)
    if a.size == 0:
        return 0.0, 0.0, 0.0, 0.0
    mean = float(a.mean())
    cv = float(a.std() / mean) if mean > 0 else 0.0
    return float(a.min()), mean, float(a.max()), cv



@dataclass
class AnalysisReport:
    name: str
    shape: tuple[int, int]
    nnz: int
    density: float
    dtype: str
    values_synthetic: bool
    note: str
    row_nnz_min: int
    row_nnz_mean: float
    row_nnz_max: int
    row_nnz_cv: float          # imbalance across rows
    col_nnz_cv: float
    fits: dict = field(default_factory=dict)   # family name -> [Fit]

    def exact_fits(self) -> list[str]:
        """Tags of the patterns the matrix fits with no conversion cost."""
        return [f.tag for fits in self.fits.values() for f in fits if f.fits]

    def to_dict(self) -> dict:
        d = {k: getattr(self, k) for k in
             ("name", "nnz", "density", "dtype", "values_synthetic", "note", "row_nnz_min",
              "row_nnz_mean", "row_nnz_max", "row_nnz_cv", "col_nnz_cv")}
        d["shape"] = list(self.shape)
        for fam, fits in self.fits.items():
            d[fam] = [dict(f.data, pattern=f.spec) for f in fits]
        d["exact_fits"] = self.exact_fits()
        return _plain(d)

    def format(self) -> str:
        m, k = self.shape
        lines = [f"{self.name or 'matrix'}: {m} x {k}, nnz {self.nnz} "
                 f"(density {self.density:.4f}, sparsity {1 - self.density:.4f}), {self.dtype}"]
        if self.values_synthetic or self.note:
            lines.append(f"  note: {self.note or 'values are synthetic'}")
        lines.append(f"  rows: nnz min {self.row_nnz_min}, mean {self.row_nnz_mean:.1f}, "
                     f"max {self.row_nnz_max}, cv {self.row_nnz_cv:.3f}; columns: cv {self.col_nnz_cv:.3f}")
        lines.append("  family        fits  cost (zeros/nnz)  detail")
        for fits in self.fits.values():
            for f in fits:
                lines.append(f"  {f.tag:<13} {'yes' if f.fits else 'no':<5} {f.cost_text:<17} "
                             f"{f.detail}")
        lines.append(f"  fits exactly: {', '.join(self.exact_fits())}")
        return "\n".join(lines)


def _plain(x):
    """JSON-safe copy: numpy scalars to Python numbers, tuples to lists."""
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, np.generic):
        return x.item()
    return x



def analyze(matrix: SparseMatrix, name: Optional[str] = None,
            families: Optional[list] = None) -> AnalysisReport:
    """Statistics of `matrix` and how it fits every family (or the named
    ones), in the families' order."""
    from .families import families as registry
    rmin, rmean, rmax, rcv = stats(matrix.row_nnz())
    _, _, _, ccv = stats(np.bincount(matrix.indices, minlength=matrix.cols))
    rep = AnalysisReport(
        name=name if name is not None else matrix.name, shape=matrix.shape, nnz=matrix.nnz,
        density=matrix.density, dtype=matrix.dtype, values_synthetic=matrix.values_synthetic,
        note=str(matrix.meta.get("note", "")), row_nnz_min=int(rmin), row_nnz_mean=rmean,
        row_nnz_max=int(rmax), row_nnz_cv=rcv, col_nnz_cv=ccv)
    for fam in sorted(registry().values(), key=lambda f: f.name):
        if families is None or fam.name in families:
            rep.fits[fam.name] = fam.analyze(matrix)
    return rep
