"""Whether a test of one of our llama.cpp patches runs, skips or fails on the installed build.

scripts/setup.sh applies the patches unless ``LOCALSPEC_PATCH=off``. A build that
should carry a patch's feature on this CPU and does not is a broken build: the
test fails, naming the feature, instead of skipping quietly. A feature that does
not apply here (an ISA the kernel needs is missing, a GPU build, a build made with
``LOCALSPEC_PATCH=off``) skips.
"""

from __future__ import annotations

import os
import platform

import pytest


def require_patch(flag: str, what: str, *, value: str | None = None, needs: tuple[str, ...] = (),
                  x86_only: bool = False) -> None:
    """Skip or fail unless the build's system line has ``flag`` ("FA_BATCH_INVARIANT", "Q8_0_COLS"...).

    ``needs``: CPU features the kernel is built for ("AVX2", "AVX512_VNNI"); ``x86_only``: it exists
    on x86 alone. Where those do not hold the feature is not expected and the test skips. ``value``:
    the value the flag must have where it is there ("FA_INVARIANT_CHUNK = 128").
    """
    from localspec.backend.build import gpu_offload_supported, system_flags

    flags = system_flags()
    if flag in flags:
        if value is not None and flags[flag] != value:
            pytest.fail(f"this build's {flag} is {flags[flag]}, not {value}: the {what} changed; update the test")
        return
    if os.environ.get("LOCALSPEC_PATCH", "on") == "off":
        pytest.skip(f"built with LOCALSPEC_PATCH=off: no {what}")
    if gpu_offload_supported():
        pytest.skip(f"a GPU build: the {what} is a CPU kernel")
    if x86_only and platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip(f"the {what} exists on x86 only")
    missing = [f for f in needs if flags.get(f) != "1"]
    if missing:
        pytest.skip(f"this CPU build lacks {', '.join(missing)}, which the {what} needs")
    pytest.fail(f"this llama.cpp build should carry localspec's {what} ({flag} in its system line) and does not: "
                "rebuild it with scripts/setup.sh")
