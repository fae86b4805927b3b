"""Subcommands of this area; `register` adds them to the `scaler` command line."""

from __future__ import annotations

import argparse
from typing import Any


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    """Add this area's subcommands. Each sets `handler=func(args) -> exit code`."""
