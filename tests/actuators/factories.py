"""Builders of the policies and decisions the actuator tests feed in, and another writer."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from scaler.actuators import client
from scaler.engine import types
from scaler.policy import model


def make_policy(namespace: str, target: str, *, kind: str = "Deployment",
                api_version: str = "apps/v1", node_pool: model.NodePool | None = None,
                gpus_per_replica: int = 1) -> model.ScalePolicy:
    return model.ScalePolicy(
        api_version="scaler.io/v1alpha1", kind="ScalePolicy",
        metadata=model.Metadata(name=target, namespace=namespace),
        spec=model.ScalePolicySpec(
            target=model.Target(api_version=api_version, kind=kind, name=target),
            replicas=model.Replicas(min=0, max=64),
            signals=model.Signals(concurrency=model.ConcurrencySignal(target_per_replica=10)),
            node_pool=node_pool,
            resources=model.Resources(gpus_per_replica=gpus_per_replica),
        ),
    )


def make_decision(model_key: str, *, current: int, desired: int, at: float = 0.0
                  ) -> types.Decision:
    return types.Decision(model=model_key, at=at, current=current, desired=desired,
                          recommendation=desired, winner="concurrency", signals=())


OtherWriter = Callable[[client.Obj], Awaitable[Any]]
"""Another writer's API calls, given what the actuator read."""


@dataclass(slots=True)
class InterleavedApi(client.KubeApi):
    """The API as an actuator sees it, where another writer gets in between its read and
    its write: right after the first GET of `after_read_of`, `other_writer(what_was_read)`
    runs (real API calls), as a controller does on a real cluster."""

    after_read_of: str = ""
    other_writer: OtherWriter | None = None

    async def get(self, path: str, *, query: dict[str, str] | None = None) -> client.Obj:
        read = await client.KubeApi.get(self, path, query=query)
        writer = self.other_writer
        if writer is not None and path == self.after_read_of:
            self.other_writer = None  # once: the actuator's re-read sees the result
            await writer(read)
        return read


def interleaved(api: client.KubeApi, *, after_read_of: str,
                other_writer: OtherWriter) -> InterleavedApi:
    """`api`'s client, with `other_writer` run once right after the read of `after_read_of`."""
    return InterleavedApi(api.api_client, timeout_s=api.timeout_s, retry=api.retry,
                          after_read_of=after_read_of, other_writer=other_writer)


async def write_status(api: client.KubeApi, path: str) -> str:
    """Write an object's status as its controller does (a new condition message each time,
    so the write is never a no-op); returns the resourceVersion it moved to."""
    written = await api.merge_patch(f"{path}/status", {
        "status": {"conditions": [{"type": "ScalerTestStatusWrite", "status": "True",
                                   "reason": "StatusWrite", "message": uuid.uuid4().hex}]}})
    return str(written["metadata"]["resourceVersion"])
