"""What the demo replays: its options, the trace slice and one simulated cluster per policy."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from scaler.demo import cluster as demo_cluster
from scaler.demo import defaults
from scaler.policy import loader
from scaler.policy import model as policy_model
from scaler.service import settings as service_settings
from scaler.sim import profiles, run, strategies, traces

# Without --rate-scale, a policy whose most replicas cannot carry the default load gets
# the default halved until they can (at most this many halvings: x8 -> x0.25). The MIG
# example (max 24 slices) needs 37 at conv x8, 19 at x4: it replays x4.
MAX_HALVINGS = 5


class DemoError(Exception):
    """Bad input (a policy, trace or option): the message says what, exit code 2."""


@dataclass(frozen=True, slots=True)
class DemoOptions:
    policy: Path = defaults.DEFAULT_POLICY
    trace: Path = defaults.DEFAULT_TRACE
    trace_format: traces.TraceFormat = "auto"
    rate_scale: float | None = None  # None: the default, halved for a policy that needs it
    seed: int = 0
    speed: float = defaults.DEFAULT_SPEED
    duration_s: float = defaults.DEFAULT_DURATION_S
    initial_replicas: int | None = None
    report: Path | None = None
    json_path: Path | None = None
    ui: bool = True
    metrics_api: bool = False
    log_level: str = "WARNING"


Models = dict[str, demo_cluster.SimulatedModel]


def replica_limit(policy: policy_model.ScalePolicy) -> int:
    """The most replicas the policy can ever run: its max, within its GPU budget and pool."""
    spec = policy.spec
    per_replica = spec.resources.gpus_per_replica
    limits = [spec.replicas.max]
    if spec.budget is not None:
        limits.append(spec.budget.max_gpus // per_replica)
    if spec.node_pool is not None and spec.node_pool.max_nodes is not None:
        limits.append(spec.node_pool.max_nodes * (spec.node_pool.gpus_per_node // per_replica))
    return min(limits)


@dataclass(frozen=True, slots=True)
class Load:
    """The trace slice one model replays, the replicas it needs per minute, and a warning."""

    trace: traces.Trace
    need: npt.NDArray[np.int64]
    warning: str | None = None

    @property
    def peak_need(self) -> int:
        return int(self.need.max()) if self.need.size else 0


def _slice(options: DemoOptions, rate_scale: float) -> traces.Trace:
    try:
        full = traces.load_trace(options.trace, options.trace_format, rate_scale=rate_scale,
                                 seed=options.seed)
    except traces.TraceError as error:
        raise DemoError(str(error)) from None
    trace = traces.cut(full, start_s=None, duration_s=options.duration_s)
    if trace.requests == 0:
        raise DemoError(f"no requests in the first {options.duration_s:g} s of {options.trace}")
    return trace


def load_for(options: DemoOptions, *, policy: policy_model.ScalePolicy,
             profile: profiles.ReplicaProfile) -> Load:
    """The load this policy replays, with a warning when its replicas cannot carry it.

    The need is the oracle's (`strategies.oracle.oracle_need`: replicas per minute at 85 %
    of saturation for the requests actually in the slice). With --rate-scale the user's
    load stands and a need above `replica_limit` is a warning (the SLO will be missed:
    an example policy's max is not a mistake the demo should hide); without it, the
    default rate is halved until the need fits.
    """
    limit = replica_limit(policy)
    rate = options.rate_scale or defaults.DEFAULT_RATE_SCALE
    halvings = 0 if options.rate_scale is not None else MAX_HALVINGS
    load = _load(options, rate=rate, profile=profile)
    tried: list[str] = []
    while load.peak_need > limit and halvings > 0:
        tried.append(f"x{rate:g} needs {load.peak_need}")
        rate, halvings = rate / 2, halvings - 1
        load = _load(options, rate=rate, profile=profile)
    peak = load.peak_need
    warning = None
    if peak > limit:
        warning = (f"{policy.key}: the replayed load (rate x{rate:g}) needs {peak} replicas "
                   f"at peak, more than the {limit} the policy allows (replicas.max, budget, "
                   "node pool): expect missed SLOs; lower --rate-scale")
    elif tried:
        warning = (f"{policy.key}: replaying at rate x{rate:g}, which needs {peak} replicas "
                   f"at peak ({', '.join(tried)}; the policy allows {limit})")
    return dataclasses.replace(load, warning=warning)


def _load(options: DemoOptions, *, rate: float, profile: profiles.ReplicaProfile) -> Load:
    trace = _slice(options, rate)
    return Load(trace=trace, need=strategies.oracle.oracle_need(trace, profile))


def load_models(options: DemoOptions) -> tuple[Models, dict[str, str]]:
    """One simulated cluster per policy in `options.policy`, and the warnings to show (by
    model key)."""
    if options.speed <= 0 or options.duration_s <= 0 or (
            options.rate_scale is not None and options.rate_scale <= 0):
        raise DemoError("--speed, --duration and --rate-scale must be positive")
    for output in (options.report, options.json_path):
        if output is not None and not output.parent.is_dir():
            raise DemoError(f"cannot write {output}: no folder {output.parent}")
    result = loader.load_paths([options.policy])
    if result.errors:
        raise DemoError("invalid policy:\n" + "\n".join(str(e) for e in result.errors))
    if not result.policies:
        raise DemoError(f"no ScalePolicy in {options.policy}")
    prefix = service_settings.NatsSettings().subject_prefix
    models: Models = {}
    warnings: dict[str, str] = {}
    for policy in result.policies:
        subject = demo_cluster.subject_of(policy, prefix=prefix)
        if subject is None:
            raise DemoError(f"policy {policy.key} has no spec.sources.nats: the demo's "
                            "replicas report over NATS")
        try:
            profile = profiles.load_profile(policy.spec.profile or "llama-3.1-8b-h100")
        except profiles.ProfileError as error:
            raise DemoError(str(error)) from None
        load = load_for(options, policy=policy, profile=profile)
        if load.warning is not None:
            warnings[policy.key] = load.warning
        initial = options.initial_replicas
        if initial is None:
            initial = run.initial_replicas(policy, load.need)
        models[policy.key] = demo_cluster.SimulatedModel(
            policy=policy, profile=profile, trace=load.trace, initial_replicas=initial,
            subject=subject)
    return models, warnings
