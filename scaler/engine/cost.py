"""The cost vocabulary (DESIGN section 1), pure: GPU-hours, cost, idle cost, cost per 1k.

One definition for the service (`/metrics`, accrued between observations) and the
simulator (totals over a replay):

    allocated_gpu_hours  = sum(gpu_count * allocation_seconds / 3600)   # cold start included
    useful_gpu_hours     = allocated_gpu_hours * average busy (SM-active) ratio
    idle_cost            = allocated_gpu_hours * hourly_rate * (1 - useful_ratio)
    cost_per_1k_requests = cost / successful_requests * 1000

Worked example: 4 GPUs for 24 h at 2.50 per GPU-hour are 96 GPU-hours costing 240; at
35 % useful, 0.65 x 240 = 156 of it is idle cost.
"""

from __future__ import annotations

from dataclasses import dataclass

from scaler.engine import types

SECONDS_PER_HOUR = 3600.0


# Built twice per cost accrual of every evaluation (`of_gpu_time`, `__add__`): the
# dataclass __init__ was about half of each (1.4 us of 2.6 for an addition).
@types.fast_init
@dataclass(frozen=True, slots=True)
class Cost:
    """GPU time and its price, additive: the cost of two intervals is their sum.

    allocated_gpu_seconds: GPUs held (ready and starting replicas) x seconds.
    useful_gpu_seconds: the busy part of it (never more than allocated).
    cost / idle_cost: in the policy's currency (`cost.gpuHourly` per GPU-hour).
    requests: requests served in the interval, for cost per 1k requests.
    """

    allocated_gpu_seconds: float = 0.0
    useful_gpu_seconds: float = 0.0
    cost: float = 0.0
    idle_cost: float = 0.0
    requests: float = 0.0

    @property
    def allocated_gpu_hours(self) -> float:
        return self.allocated_gpu_seconds / SECONDS_PER_HOUR

    @property
    def useful_gpu_hours(self) -> float:
        return self.useful_gpu_seconds / SECONDS_PER_HOUR

    @property
    def useful_ratio(self) -> float:
        """Useful over allocated GPU time, 0 when nothing was allocated."""
        if self.allocated_gpu_seconds <= 0:
            return 0.0
        return min(1.0, self.useful_gpu_seconds / self.allocated_gpu_seconds)

    @property
    def cost_per_1k_requests(self) -> float | None:
        """cost / requests x 1000; None before any request was served (no price per
        request can be stated)."""
        return self.cost / self.requests * 1000.0 if self.requests > 0 else None

    def __add__(self, other: Cost) -> Cost:
        return Cost(
            allocated_gpu_seconds=self.allocated_gpu_seconds + other.allocated_gpu_seconds,
            useful_gpu_seconds=self.useful_gpu_seconds + other.useful_gpu_seconds,
            cost=self.cost + other.cost,
            idle_cost=self.idle_cost + other.idle_cost,
            requests=self.requests + other.requests,
        )


def of_gpu_time(
    *, allocated_gpu_seconds: float, useful_gpu_seconds: float, gpu_hourly: float,
    requests: float = 0.0,
) -> Cost:
    """The cost of GPU time at `gpu_hourly` per GPU-hour.

    Useful time is clamped to [0, allocated]: a busy ratio above 1 (a noisy report) cannot
    make idle cost negative. Example: 96 allocated GPU-hours, 33.6 useful, at 2.50: cost
    240, idle (96 - 33.6) x 2.50 = 156.
    """
    allocated = max(0.0, allocated_gpu_seconds)
    useful = min(allocated, max(0.0, useful_gpu_seconds))
    hours = allocated / SECONDS_PER_HOUR
    return Cost(
        allocated_gpu_seconds=allocated,
        useful_gpu_seconds=useful,
        cost=hours * gpu_hourly,
        idle_cost=(allocated - useful) / SECONDS_PER_HOUR * gpu_hourly,
        requests=max(0.0, requests),
    )
