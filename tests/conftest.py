"""Fixtures shared by the whole suite.

Async tests run on anyio's pytest plugin (``@pytest.mark.anyio``), once per event loop that
hetsched supports: the runtime's loop-specific code (``hetsched._runtime._loops``) has one
module per loop and every async test exercises both. Tests about asyncio alone (the asyncio
loop module itself) use pytest-asyncio's ``@pytest.mark.asyncio`` instead.
"""

from __future__ import annotations

import pytest


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)
