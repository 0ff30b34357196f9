"""Which FAISS index a shard builds, and its parameters (``Settings.faiss_index_kind`` / ``_params``).

Kept apart from the FAISS code so the settings can validate it without importing faiss.

- ``flat``: exact inner-product search; the default, right up to a few hundred thousand chunks a shard.
- ``ivf``: inverted lists (``IndexIVFFlat``). Needs training, so a shard stays flat until it holds
  ``train_min`` vectors, then trains on them; it retrains when it has grown ``retrain_growth`` times.
  ``nprobe`` lists are scanned per query (recall against speed); by default an eighth of the lists
  (at least 16): a fixed 16 of 1,265 lists found only 62% of the true top 10 on real embeddings
  at 100k, an eighth finds about 90% (``docs/benchmarks.md``).
- ``hnsw``: a graph (``IndexHNSWFlat``), fast and accurate but it cannot remove vectors: deleted ids
  are masked at search time and the graph is rebuilt once they pass ``max_deleted_ratio``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

INDEX_KINDS = ("flat", "ivf", "hnsw")
_PARAMS = {
    "flat": (),
    "ivf": ("nlist", "nprobe", "train_min", "retrain_growth"),
    "hnsw": ("m", "ef_construction", "ef_search", "max_deleted_ratio"),
}


@dataclass(frozen=True)
class IndexSpec:
    kind: str = "flat"
    nlist: int | None = None  # IVF lists; None: 4·√n at training time (at most n/39), within [16, 65536]
    nprobe: int | None = None  # lists scanned per query; None: nlist / 8, at least 16
    train_min: int | None = None  # None: 39 vectors per list (FAISS's own minimum), at least 1,000
    retrain_growth: float = 4.0
    m: int = 32
    ef_construction: int = 200
    ef_search: int = 64
    max_deleted_ratio: float = 0.2

    @classmethod
    def parse(cls, kind: str, params: dict[str, Any] | None = None) -> IndexSpec:
        """Validate ``kind`` and the parameters that kind takes; the error names what is allowed."""
        if kind not in INDEX_KINDS:
            raise ValueError(f"unknown faiss index kind {kind!r}; supported: {', '.join(INDEX_KINDS)}")
        params = dict(params or {})
        allowed = _PARAMS[kind]
        unknown = sorted(set(params) - set(allowed))
        if unknown:
            raise ValueError(
                f"faiss index kind {kind!r} takes {', '.join(allowed) or 'no parameters'}; got {', '.join(unknown)}"
            )
        types = {f.name: f.type for f in fields(cls)}
        for name, value in params.items():
            is_float = "float" in str(types[name])
            if isinstance(value, bool) or not isinstance(value, int | float) or (not is_float and value != int(value)):
                raise ValueError(f"faiss index parameter {name} must be a {'number' if is_float else 'whole number'}")
            if value <= 0:
                raise ValueError(f"faiss index parameter {name} must be positive")
            params[name] = float(value) if is_float else int(value)
        if params.get("retrain_growth", 2.0) <= 1.0:
            raise ValueError("faiss index parameter retrain_growth must be above 1")
        if params.get("max_deleted_ratio", 0.5) >= 1.0:
            raise ValueError("faiss index parameter max_deleted_ratio must be below 1")
        return cls(kind=kind, **params)

    def lists_for(self, n: int) -> int:
        """IVF list count for ``n`` training vectors."""
        if self.nlist:
            return self.nlist
        return max(16, min(65536, int(4 * math.sqrt(max(n, 1))), n // 39))

    def probes_for(self, nlist: int) -> int:
        """IVF lists scanned per query for an index of ``nlist`` lists."""
        return min(nlist, self.nprobe or max(16, nlist // 8))

    def training_threshold(self) -> int:
        return self.train_min or max(1000, 39 * (self.nlist or 16))
