"""A Kubernetes API emulator on loopback: real wire protocol, injectable faults, for tests."""

from scaler.emulator.controller import ControllerSettings, EmulatorController
from scaler.emulator.reviews import Grant
from scaler.emulator.server import EmulatorOptions, Fault, KubeEmulator, RequestRecord
from scaler.emulator.store import ResourceType

__all__ = [
    "ControllerSettings", "EmulatorController", "EmulatorOptions", "Fault", "Grant", "KubeEmulator",
    "RequestRecord", "ResourceType",
]
