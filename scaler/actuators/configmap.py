"""A ConfigMap the service owns (the engine's learned state): read its data, replace it."""

from __future__ import annotations

from dataclasses import dataclass

from scaler.actuators import client as kube

MAX_CONFLICT_RETRIES = 3
MANAGED_BY = {"app.kubernetes.io/managed-by": "scaler"}


@dataclass(slots=True)
class ConfigMapStore:
    """`namespace/name`'s `data`, whole. Transient failures are retried by the client
    (backoff, Retry-After); a write that meets a newer resourceVersion (another writer
    between our read and our write) reads again and replaces, at most
    MAX_CONFLICT_RETRIES times."""

    api: kube.KubeApi
    namespace: str
    name: str

    @property
    def path(self) -> str:
        return f"/api/v1/namespaces/{self.namespace}/configmaps/{self.name}"

    async def read(self) -> dict[str, str]:
        """The data (empty when the ConfigMap does not exist yet); values that are not
        strings are left out (the API server stores only strings)."""
        try:
            found = await self.api.get(self.path)
        except kube.KubeError as error:
            if error.not_found:
                return {}
            raise
        data = found.get("data") or {}
        return {str(k): v for k, v in data.items() if isinstance(v, str)}

    async def write(self, data: dict[str, str]) -> None:
        """Replace the data (create the ConfigMap when missing)."""
        for attempt in range(1 + MAX_CONFLICT_RETRIES):
            try:
                current = await self.api.get(self.path)
            except kube.KubeError as error:
                if not error.not_found:
                    raise
                current = None
            try:
                if current is None:
                    body = {"apiVersion": "v1", "kind": "ConfigMap",
                            "metadata": {"name": self.name, "namespace": self.namespace,
                                         "labels": dict(MANAGED_BY)},
                            "data": data}
                    await self.api.request("POST", self.path.rpartition("/")[0], body=body)
                else:
                    # The resourceVersion read makes the PUT conditional: nobody's change
                    # in between is overwritten unseen.
                    await self.api.request("PUT", self.path, body={**current, "data": data})
                return
            except kube.KubeError as error:
                lost_race = error.conflict or (error.status == 409 and current is None)
                if not lost_race or attempt == MAX_CONFLICT_RETRIES:
                    raise
