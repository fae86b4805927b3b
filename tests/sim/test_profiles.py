"""Replica profiles: every bundled one loads, cites sources and fits the example policies."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from scaler.policy import model as policy_model
from scaler.sim import profiles

from .conftest import REPO


@pytest.mark.parametrize("name", ["llama-3.1-8b-h100", "llama-3-70b-h100-tp8",
                                  "phi-3-mini-mig-1g.10gb"])
def test_required_profiles_load_and_cite_public_sources(name: str) -> None:
    profile = profiles.load_profile(name)
    assert profile.name == name
    assert profile.sources and all(s.url.startswith("https://") for s in profile.sources)
    assert profile.cold_start.pod_start_seconds > 0


@pytest.mark.parametrize("path", sorted((REPO / "config").glob("*.yaml")), ids=lambda p: p.name)
def test_example_policies_name_a_profile_that_fits(path: Path) -> None:
    for document in yaml.safe_load_all(path.read_text()):
        if not document or document.get("kind") != "ScalePolicy":
            continue
        policy = policy_model.ScalePolicy.model_validate(document)
        if policy.spec.profile is None:
            continue
        profile = profiles.load_profile(policy.spec.profile)
        assert profile.gpus_per_replica == policy.spec.resources.gpus_per_replica
        if policy.spec.node_pool is not None:
            assert policy.spec.node_pool.gpus_per_node % profile.gpus_per_replica == 0


def test_profile_numbers_match_their_published_scale() -> None:
    # 8B on one H100: decode at batch 256 about 7,600 tokens/s (public: 5k-12.5k), and
    # the saturation formula's worked example of the docstring.
    profile = profiles.load_profile("llama-3.1-8b-h100")
    step = profile.decode_step.base_seconds + profile.decode_step.per_sequence_seconds * 256
    assert 5000 <= 256 / step <= 12500
    assert profile.saturation_rate(input_tokens=1000, output_tokens=200) == pytest.approx(
        15.09, abs=0.01)


def test_unknown_or_invalid_profiles_are_clear(tmp_path: Path) -> None:
    with pytest.raises(profiles.ProfileError, match="bundled: llama-3-70b-h100-tp8"):
        profiles.load_profile("gpt-9")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nmodel: y\n")
    with pytest.raises(profiles.ProfileError, match="bad.yaml"):
        profiles.load_profile(bad)
