"""Compiler test fixtures."""

from __future__ import annotations

import pytest


@pytest.fixture(params=["ir", "emulator"])
def mode(request: pytest.FixtureRequest) -> str:
    """Check legalizations twice: on the legalized IR with a numpy evaluator, and end to end on the emulator."""
    return request.param
