"""Fixtures for the simulator tests: policies, profiles, bundled and shared traces."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from scaler.policy import model as policy_model
from scaler.sim import profiles

REPO = Path(__file__).resolve().parents[2]
BUNDLED = REPO / "loadtests" / "traces"
# CI keeps a copy of shared/ beside the clone: <repo>/../shared/traces.
SHARED = (REPO / ".." / "shared" / "traces").resolve()


@pytest.fixture
def shared_traces() -> Path:
    if not (SHARED / "azure_llm_2023").is_dir():
        pytest.skip(f"shared traces not found at {SHARED} (CI keeps ../shared beside the clone)")
    return SHARED


@pytest.fixture
def policy_8b() -> policy_model.ScalePolicy:
    return policy_model.ScalePolicy.model_validate(
        yaml.safe_load((REPO / "config" / "llama-8b.yaml").read_text()))


@pytest.fixture
def profile_8b() -> profiles.ReplicaProfile:
    return profiles.load_profile("llama-3.1-8b-h100")
