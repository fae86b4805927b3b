"""GpuPool and GpuBudget resources as a source: a cluster without their CRDs (a Helm
upgrade installs no new CRD) still starts, and reads them once the CRDs are installed."""

from __future__ import annotations

import asyncio

import pytest

from scaler.actuators import policy_resources
from scaler.actuators import settings as kube_settings
from scaler.emulator import env as kube_env
from scaler.policy import crd

CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"


@pytest.mark.emulator_only  # a real cluster may have the CRDs, and they are cluster-wide
async def test_missing_fleet_crds_do_not_block_and_are_read_once_installed(
        kube: kube_env.KubeTestEnv) -> None:
    # Retries after 10-50 ms, so the informers list again soon after the CRD appears.
    settings = kube.settings.model_copy(update={
        "watch_namespaces": (kube.namespace,),
        "retry": kube_settings.RetrySettings(base_delay_s=0.01, max_delay_s=0.05)})
    resources = policy_resources.PolicyResources(kube.api, settings=settings)
    await kube.api.request("POST", CRDS, body=crd.definition())  # ScalePolicy only
    await resources.start(timeout_s=5.0)  # returns: only ScalePolicies must list
    try:
        assert all(each.unavailable() is not None for each in resources.fleet)
        assert resources.load().pools == [] and resources.load().errors == []

        await kube.api.request("POST", CRDS, body=crd.definition(crd.GPU_POOL))
        await kube.api.request("POST", crd.GPU_POOL.collection(), body={
            "apiVersion": crd.API_VERSION, "kind": "GpuPool", "metadata": {"name": "h100"},
            "spec": {"gpusPerNode": 8, "maxNodes": 2}})
        async with asyncio.timeout(5.0):
            while not resources.load().pools:
                await asyncio.sleep(0.02)
        (pool,) = resources.load().pools
        assert pool.path == "gpupools/h100" and pool.value.spec.total_gpus == 16
        assert list(resources.fleet_objects()) == ["gpupools/h100"]
        budgets = resources.fleet[1]
        assert budgets.kind is crd.GPU_BUDGET and budgets.unavailable() is not None
    finally:
        await resources.stop()
