"""Replica performance profiles: how fast one simulated replica serves, and how long it starts."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import numpy.typing as npt
import pydantic
import yaml
from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

PROFILE_DIR = Path(__file__).resolve().parent / "profiles"


class _Model(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )


class DecodeStep(_Model):
    """Time of one decode iteration: base + per_sequence * batch (seconds)."""

    base_seconds: float = Field(gt=0)
    per_sequence_seconds: float = Field(ge=0)


class ProfileColdStart(_Model):
    """The true start chain in the simulated cluster (seconds)."""

    node_boot_seconds: float = Field(ge=0)
    image_pull_seconds: float = Field(ge=0)
    model_load_seconds: float = Field(ge=0)
    readiness_seconds: float = Field(ge=0)

    @property
    def pod_start_seconds(self) -> float:
        return self.image_pull_seconds + self.model_load_seconds + self.readiness_seconds


class NodeShape(_Model):
    gpus_per_node: int = Field(ge=1)


class Source(_Model):
    what: str
    url: str


class ReplicaProfile(_Model):
    """One model on one GPU type (or slice), as a continuous-batching server."""

    name: str
    model: str
    gpu: str
    engine: str = "vLLM"
    gpus_per_replica: int = Field(ge=1)
    prefill_tokens_per_second: float = Field(gt=0)
    decode_step: DecodeStep
    kv_cache_tokens: int = Field(gt=0)
    # vLLM's max_model_len: prompt + requested output tokens above it are refused (HTTP
    # 400). vLLM will not start with a context longer than its KV cache holds.
    max_model_len: int = Field(gt=0)
    max_batch: int = Field(ge=1)
    max_batched_tokens: int = Field(ge=1)
    cold_start: ProfileColdStart
    node: NodeShape
    sources: tuple[Source, ...] = Field(min_length=1)

    @pydantic.model_validator(mode="after")
    def _context_fits_the_cache(self) -> ReplicaProfile:
        if self.max_model_len > self.kv_cache_tokens:
            raise ValueError(
                f"maxModelLen {self.max_model_len} exceeds kvCacheTokens {self.kv_cache_tokens}:"
                " vLLM refuses to start when one sequence cannot fit in the KV cache")
        return self

    def accepts(self, *, input_tokens: npt.ArrayLike, output_tokens: npt.ArrayLike
                ) -> npt.NDArray[np.bool_]:
        """Which requests vLLM serves: prompt + output within maxModelLen (else HTTP 400).

        Lengths below 1 count as 1 (as the simulator serves them). 8B profile (131,072):
        120,000 in + 20,000 out is refused; 120,000 + 11,072 is served.
        """
        total = (np.maximum(np.asarray(input_tokens, dtype=np.float64), 1.0)
                 + np.maximum(np.asarray(output_tokens, dtype=np.float64), 1.0))
        accepted: npt.NDArray[np.bool_] = total <= self.max_model_len
        return accepted

    def batch_limit(self, *, input_tokens: float, output_tokens: float) -> float:
        """Requests that fit in one batch: max_batch, or fewer when the KV cache binds.

        8B profile, 2,048 in + 28 out: 400,000 / 2,076 = 192 < 256, so the KV cache binds.
        """
        per_request = max(1.0, input_tokens + output_tokens)
        return max(1.0, min(float(self.max_batch), self.kv_cache_tokens / per_request))

    def saturation_rate(self, *, input_tokens: float, output_tokens: float) -> float:
        """Requests/s one replica completes at saturation, for a mix with these mean lengths.

        In steady state at batch B, each iteration emits one token for each of B
        decoders, so B/O requests finish per iteration and their B*I/O prefill tokens
        are processed in it: T = a + b*B + (B*I/O)/prefill_rate, rate = (B/O)/T.
        8B profile, I=1,000, O=200: B=256, T = 8 + 25.6 + 51.2 ms = 84.8 ms -> 15.1 req/s.
        A step carries at most `max_batched_tokens` (decode plus prefill chunk).
        The simulator's fluid model follows the same arithmetic (a test checks it).
        """
        out = max(1.0, output_tokens)
        batch = self.batch_limit(input_tokens=input_tokens, output_tokens=out)
        # One step holds at most max_batched_tokens: B decode tokens plus B*I/O prefill
        # tokens, so B <= budget * O / (I + O). Code mix (2,048 in, 28 out): 8,192 * 28 /
        # 2,076 = 110 decoders, i.e. prefill-bound (about 11.5 req/s).
        batch = min(batch, self.max_batched_tokens * out / (input_tokens + out))
        step = (
            self.decode_step.base_seconds
            + self.decode_step.per_sequence_seconds * batch
            + batch * input_tokens / out / self.prefill_tokens_per_second
        )
        return batch / out / step


class ProfileError(ValueError):
    """A profile that is missing or invalid; the message names the file."""


def available() -> list[str]:
    return sorted(p.stem for p in PROFILE_DIR.glob("*.yaml"))


def load_profile(name_or_path: str | Path) -> ReplicaProfile:
    """A bundled profile by name (e.g. 'llama-3.1-8b-h100') or a YAML file by path."""
    path = Path(name_or_path)
    if path.suffix not in (".yaml", ".yml"):
        # A name: dots are part of names ('llama-3.1-8b-h100'), so no suffix test on it.
        path = PROFILE_DIR / f"{name_or_path}.yaml"
    if not path.is_file():
        raise ProfileError(
            f"no replica profile {str(name_or_path)!r}; bundled: {', '.join(available())}"
        )
    try:
        return ReplicaProfile.model_validate(yaml.safe_load(path.read_text()))
    except (pydantic.ValidationError, yaml.YAMLError) as exc:
        raise ProfileError(f"{path}: {exc}") from exc
