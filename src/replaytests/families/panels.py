"""Panels: the rows a family runs on, chosen from prefix lengths and row ids alone, never from outcomes."""

from __future__ import annotations

from typing import Protocol


class _Row(Protocol):
    id: str
    prefix_len: int


def spaced(rows: list[_Row], size: int) -> list[_Row]:
    """`size` rows at uniformly spaced order statistics of prefix length (ties broken by row id)."""
    ordered = sorted(rows, key=lambda r: (r.prefix_len, r.id))
    if size >= len(ordered):
        return ordered
    if size <= 0:
        return []
    if size == 1:
        return [ordered[len(ordered) // 2]]
    return [ordered[round(i * (len(ordered) - 1) / (size - 1))] for i in range(size)]
