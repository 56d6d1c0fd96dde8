"""Comparisons between two arms (docs/protocol.md §5), at the boundary and after it.

Drift is eq. 2 of the paper, computed in float64: d_rel = ||A - B||_2 / max(||A||_2, ||B||_2),
for K and V separately, per layer and over all layers concatenated.
"""

from __future__ import annotations

import math

import torch

from replaytests.engine.boundary import Boundary, Suffix, bitwise_equal


def _drift(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> dict:
    """Relative L2 and max |diff| over a list of tensor pairs taken as one concatenated tensor."""
    diff_sq = norm_a_sq = norm_b_sq = 0.0
    max_abs = 0.0
    for a, b in pairs:
        a64, b64 = a.double(), b.double()
        delta = a64 - b64
        diff_sq += float(delta.square().sum())
        norm_a_sq += float(a64.square().sum())
        norm_b_sq += float(b64.square().sum())
        max_abs = max(max_abs, float(delta.abs().max()) if delta.numel() else 0.0)
    denominator = math.sqrt(max(norm_a_sq, norm_b_sq))
    rel = math.sqrt(diff_sq) / denominator if denominator else 0.0
    return {"rel_l2": rel, "max_abs": max_abs}


# The cache metrics, null where either arm's backend exposes no K/V tensors (not measured, never "exact").
CACHE_METRICS = ("cache_exact", *(f"{part}_{name}" for part in "kv" for name in
                                  ("rel_l2", "max_abs", "rel_l2_per_layer", "max_abs_per_layer")))


def compare_boundaries(a: Boundary, b: Boundary) -> dict:
    metrics = _compare_caches(a.layers, b.layers) if a.has_kv and b.has_kv else dict.fromkeys(CACHE_METRICS)
    metrics["logits_exact"] = bitwise_equal(a.logits, b.logits)
    metrics["logits_max_abs"] = _drift([(a.logits, b.logits)])["max_abs"]
    metrics["argmax_equal"] = int(a.logits.argmax()) == int(b.logits.argmax())
    stored_a, stored_b = a.stored(), b.stored()
    if stored_a and stored_b:  # a quantized cache: what is stored, beside what attention reads (cache_exact)
        metrics["stored_exact"] = len(stored_a) == len(stored_b) and all(
            bitwise_equal(x, y) for x, y in zip(stored_a, stored_b, strict=True))
    return metrics


def _compare_caches(layers_a: list, layers_b: list) -> dict:
    metrics: dict = {
        "cache_exact": all(
            bitwise_equal(ka, kb) and bitwise_equal(va, vb)
            for (ka, va), (kb, vb) in zip(layers_a, layers_b, strict=True)
        ),
    }
    for name, part in (("k", 0), ("v", 1)):
        pairs = [(la[part], lb[part]) for la, lb in zip(layers_a, layers_b, strict=True)]
        overall = _drift(pairs)
        per_layer = [_drift([pair]) for pair in pairs]
        metrics[f"{name}_rel_l2"] = overall["rel_l2"]
        metrics[f"{name}_max_abs"] = overall["max_abs"]
        metrics[f"{name}_rel_l2_per_layer"] = [d["rel_l2"] for d in per_layer]
        metrics[f"{name}_max_abs_per_layer"] = [d["max_abs"] for d in per_layer]
    return metrics


def first_divergence(a: list[int], b: list[int]) -> int | None:
    """0-based index of the first differing suffix position; None if the suffixes are equal."""
    for index, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return index
    return None if len(a) == len(b) else min(len(a), len(b))


def compare_suffixes(a: Suffix, b: Suffix, correct_a: bool | None, correct_b: bool | None) -> dict:
    index = first_divergence(a.tokens, b.tokens)
    return {
        "suffix_equal": index is None,
        "first_divergence": index,
        # The structurally masked greedy choice at the boundary: where it differs, no transplant of the
        # cache can move the trajectory (the recipient keeps its own boundary logits).
        "first_token_equal": a.tokens[:1] == b.tokens[:1],
        # The decision margins (top-1 minus top-2 masked logit) where the paths split, if they do, and the
        # top-1 logits they are measured against (a margin within one BF16 step of them is a near tie).
        "margins_at_divergence": None if index is None else [a.margins[index], b.margins[index]],
        "top1_at_divergence": None if index is None or not (a.top1 and b.top1) else [a.top1[index], b.top1[index]],
        "answer_equal": a.answer == b.answer,
        "correct_equal": correct_a == correct_b,
    }
