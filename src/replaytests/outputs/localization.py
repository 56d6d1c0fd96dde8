"""Where two runs' numbers first moved: per cell and construction, the first layer
whose K or V digest changed, whether the boundary logits changed, whether any suffix changed.

It reads the arms of the records both runs hold (ok in both), matched by arm name; a replica is its
construction (`incremental_replica` counts as `incremental`). The first layer is read from each arm's
per-layer digests (ledger/3); an arm of an older ledger has only its whole-cache digest, and its first
layer is "unknown".
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field

from replaytests.outputs.records import LayerDigests, Record

TRAJECTORY = ("suffix", "answer", "correct")


def construction(arm: str) -> str:
    """The construction an arm was made by: its name with `_replica` dropped on each side of a `<-`."""
    return "<-".join(side.removesuffix("_replica") for side in arm.split("<-"))


def first_moved(before: LayerDigests | None, after: LayerDigests | None) -> tuple[int, str] | None:
    """The first layer whose K or V digest differs, with which moved there (`K`, `V` or `K and V`);
    None where none differs. Raises LookupError where either side lacks per-layer digests."""
    if before is None or after is None:
        raise LookupError("no per-layer digests")
    for layer, (kb, vb, ka, va) in enumerate(zip(before.k, before.v, after.k, after.v, strict=False)):
        parts = [name for name, old, new in (("K", kb, ka), ("V", vb, va)) if old != new]
        if parts:
            return layer, " and ".join(parts)
    return None


@dataclass
class Moved:
    """One (cell, construction) over the arms both runs hold."""

    arms: int = 0
    measured: int = 0  # arms with a K/V cache on both sides
    cache: int = 0
    first: Counter = field(default_factory=Counter)  # (layer, parts) or "unknown" -> arms whose cache moved there
    logits: int = 0
    suffix: int = 0

    @property
    def moved(self) -> bool:
        return bool(self.cache or self.logits or self.suffix)

    def earliest(self) -> str | None:
        """`layer L (K and V)` of the earliest first-moved layer, `unknown`, or None if no cache moved."""
        known = sorted(k for k in self.first if k != "unknown")
        if known:
            layer = known[0][0]
            parts = sorted({p for lay, ps in known if lay == layer for p in ps.split(" and ")})
            return f"layer {layer} ({' and '.join(parts)})"
        return "unknown (a ledger without per-layer digests)" if self.first else None

    def line(self, cell: str, name: str) -> str:
        if not self.moved:
            return f"{cell} {name}: bit-identical in {self.arms} arms"
        where = ", ".join(f"{'unknown' if k == 'unknown' else f'layer {k[0]} ({k[1]})'}: {n}"
                          for k, n in sorted(self.first.items(), key=lambda item: (-item[1], str(item[0])))[:3])
        cache = (f"cache moved in {self.cache}/{self.measured} (first at {where})" if self.cache
                 else f"cache held in {self.measured}" if self.measured else "cache not measured")
        return (f"{cell} {name}: {cache}; logits moved in {self.logits}/{self.arms}; "
                f"suffix moved in {self.suffix}/{self.arms}")


def localize(baseline: list[Record], new: list[Record]) -> dict[str, dict[str, Moved]]:
    """cell -> construction -> Moved, over the arms of the records ok in both runs."""
    before = {r.key: r for r in baseline if r.ok}
    out: dict[str, dict[str, Moved]] = defaultdict(lambda: defaultdict(Moved))
    for record in new:
        old = before.get(record.key)
        if old is None or not record.ok:
            continue
        for arm in sorted(record.arms.keys() & old.arms.keys()):
            a, b = old.arms[arm], record.arms[arm]
            moved = out[record.precision][construction(arm)]
            moved.arms += 1
            if a.cache_digest is not None and b.cache_digest is not None:
                moved.measured += 1
                if a.cache_digest != b.cache_digest:
                    moved.cache += 1
                    try:
                        moved.first[first_moved(a.layer_digests, b.layer_digests) or "unknown"] += 1
                    except LookupError:
                        moved.first["unknown"] += 1
            moved.logits += a.logits_digest != b.logits_digest
            moved.suffix += any(getattr(a, f) != getattr(b, f) for f in TRAJECTORY)
    return out


def summary(cell: str, constructions: dict[str, Moved]) -> str:
    """One line for a cell: what moved, from which layer, and whether any behaviour changed."""
    arms = sum(m.arms for m in constructions.values())
    logits, suffixes = (sum(getattr(m, f) for m in constructions.values()) for f in ("logits", "suffix"))
    if not any(m.moved for m in constructions.values()):
        return f"{cell}: bit-identical ({arms} arms in {len(constructions)} constructions)"
    caches = {name: m.earliest() for name, m in constructions.items() if m.cache}
    measured = [name for name, m in constructions.items() if m.measured]
    if caches:
        whose = "every construction's cache" if list(caches) == measured else f"the cache of {', '.join(caches)}"
        first = (next(iter(caches.values())) if len(set(caches.values())) == 1
                 else "; ".join(f"{where} ({name})" for name, where in caches.items()))
        cache = f"{whose} moved, first at {first}"
    else:
        cache = "no cache moved" if measured else "caches not measured"
    moved_logits = ("the logits moved" + ("" if logits == arms else f" in {logits}/{arms} arms")) if logits \
        else "the logits held"
    moved_suffixes = f"suffixes moved in {suffixes}/{arms} arms" if suffixes else "no suffix moved"
    kind = "a behavioural change" if suffixes else "a numerical change, no behavioural change"
    return f"{cell}: {cache}; {moved_logits}; {moved_suffixes}: {kind}"


def lines(baseline: list[Record], new: list[Record]) -> list[str]:
    """The summary line of each cell, then one line per (cell, construction)."""
    found = localize(baseline, new)
    out = [summary(cell, found[cell]) for cell in sorted(found)]
    return out + [found[p][c].line(p, c) for p in sorted(found) for c in sorted(found[p])]
