"""Warnings about valid policies that will not behave as their author likely expects."""

from __future__ import annotations

from scaler.core import histogram, vocabulary
from scaler.policy import model


def warnings(policy: model.ScalePolicy) -> list[str]:
    """What `scaler validate` warns about (a valid policy; nothing is refused).

    The latency guard reads which share of requests is within the SLO from the bucket
    edges around it. With vLLM's TTFT buckets (..., 1.0, 2.5, ...) a 2 s SLO lies inside
    (1, 2.5]: the guard can confirm a violation only when more than 5 % of requests take
    longer than 2.5 s, and a p95 interpolated inside the bucket (as Prometheus'
    histogram_quantile does) reads high. An SLO on an edge is read exactly.
    """
    found = _variant_warnings(policy)
    guard = policy.spec.signals.p95_latency
    if guard is None or guard.metric is not vocabulary.LatencyMetric.TTFT:
        return found
    edges = histogram.VLLM_TTFT_BUCKETS
    slo = guard.slo_seconds
    if slo in edges or slo > edges[-1]:
        return found
    upper = min(edge for edge in edges if edge > slo)
    lower = max((edge for edge in edges if edge < slo), default=0.0)
    return [*found,
        f"{policy.key}: signals.p95Latency.sloSeconds {slo:g} lies inside vLLM's TTFT bucket "
        f"({lower:g}, {upper:g}]: the guard confirms a violation only when more than 5 % of "
        f"requests exceed {upper:g} s (an interpolated p95 reads high there). An SLO on a "
        f"bucket edge ({lower:g} or {upper:g}) is read exactly."
    ]


def _variant_warnings(policy: model.ScalePolicy) -> list[str]:
    """With spec.variants the service reads and patches each variant's target, never
    spec.target: say so when spec.target is not one of them (docs/scaling.md)."""
    spec = policy.spec
    targets = {(v.target.kind, v.target.name) for v in spec.variants}
    if not spec.variants or (spec.target.kind, spec.target.name) in targets:
        return []
    return [f"{policy.key}: spec.target {spec.target.kind} {spec.target.name} is neither "
            "read nor scaled while spec.variants is set: the service scales each "
            "variant's target (docs/scaling.md, Variants)"]
