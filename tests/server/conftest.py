"""The folder's one server: a real ``localspec serve`` process on a free loopback port (support/served.py).

Every test here is slow by the folder (tests/conftest.py): each runs a real server.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest
from served import Served, start_server, stop_server


@pytest.fixture(scope="session")
def server(smollm2_path: Path) -> Iterator[Served]:
    """SmolLM2 with the n-gram drafter at a fixed draft length of 3 (so that every test sees
    speculation happen, whatever the controller would decide on this machine), a 1,024-token
    context, a line of 2 and an API key."""
    served = start_server(str(smollm2_path), "--draft", "ngram", "--draft-max", "3", "--ctx", "1024",
                          "--gpu-layers", "0", "--queue", "2")
    yield served
    stop_server(served)
