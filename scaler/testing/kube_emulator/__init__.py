"""A Kubernetes API emulator on loopback: real wire protocol, injectable faults, for tests."""

from scaler.testing.kube_emulator.controller import ControllerSettings, EmulatorController
from scaler.testing.kube_emulator.reviews import Grant
from scaler.testing.kube_emulator.server import EmulatorOptions, Fault, KubeEmulator, RequestRecord
from scaler.testing.kube_emulator.store import ResourceType

__all__ = [
    "ControllerSettings", "EmulatorController", "EmulatorOptions", "Fault", "Grant", "KubeEmulator",
    "RequestRecord", "ResourceType",
]
