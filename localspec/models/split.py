"""A target over several devices: the records the backend loads with, and the shares of each device.

llama.cpp splits a model's offloaded layers over ``llama_model_params.devices`` in proportion to
``tensor_split`` (layer split: whole layers, in order, the output layer on the last device; row
split: each matrix's rows), and keeps a compute buffer on each device it uses. Local GPUs and remote
ggml RPC servers are devices alike (llama.cpp lists the RPC servers first). The draft stays on one
local device: a remote one would cost a network hop for each of its γ tokens per step.

Pure logic: the backend fills in the devices it finds (``localspec.backend.devices``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Sequence

from localspec.errors import InvalidOptionError
from localspec.llama_facts import RPC_DEFAULT_PORT

SPLIT_MODES = ("layer", "row", "none")
"""llama.cpp's split modes as ``--split-mode`` names them (llama.cpp's own names); layer is its default."""


@dataclass(frozen=True)
class Device:
    """A device llama.cpp can place layers on: its ggml name (``RPC0``, ``CUDA1``), what it is (a GPU's
    model, a server's ``host:port``), its free and total memory as llama.cpp reports them, and the
    backend's handle (0 for a device only planned for, e.g. from ``--vram`` sizes)."""

    name: str
    description: str
    free: int
    total: int
    remote: bool = False
    handle: int = field(default=0, repr=False, compare=False)


@dataclass(frozen=True)
class DeviceSplit:
    """Where a model's offloaded layers go: ``devices`` in order, each taking ``shares[i]`` of them
    (empty: llama.cpp's own shares, by free memory); ``main_gpu`` indexes ``devices`` (the one device of
    split mode ``none``; where row split keeps intermediate results). No devices: the CPU only."""

    devices: tuple[Device, ...]
    shares: tuple[float, ...] = ()
    mode: str = "layer"
    main_gpu: int = 0

    def describe(self) -> str:
        """One line: each device and its share (``RPC0 127.0.0.1:50052 50%, CUDA0 ... 50%``)."""
        if not self.devices:
            return "the CPU"
        shares = self.shares or (1.0 / len(self.devices),) * len(self.devices)
        return ", ".join(f"{d.name} ({d.description}) {s:.0%}" for d, s in zip(self.devices, shares))


def parse_endpoints(text: str) -> tuple[str, ...]:
    """``host:port[,host:port]`` as endpoints; a bare host takes rpc-server's default port.
    Raises InvalidOptionError (param ``rpc``) for anything else."""
    if not text.strip():
        raise InvalidOptionError("rpc is empty: name the rpc-server machines as host:port (e.g. "
                                 "192.168.1.20:50052), or leave the option out", param="rpc")
    out = []
    for part in (p.strip() for p in text.split(",")):
        if re.fullmatch(r"\[[0-9A-Fa-f:.%\w]*\](?::\d{1,5})?", part):
            # ggml's RPC client splits an endpoint at its first colon and resolves IPv4 names only.
            raise InvalidOptionError(f"rpc {part!r} is an IPv6 address, which llama.cpp's RPC client cannot reach "
                                     "(it takes IPv4 host:port only); use the machine's IPv4 address or a host name "
                                     "that resolves to one", param="rpc")
        m = re.fullmatch(r"([A-Za-z0-9.\-_]+)(?::(\d{1,5}))?", part)
        port = int(m.group(2)) if m and m.group(2) else RPC_DEFAULT_PORT
        if not m or not 0 < port < 65536:
            raise InvalidOptionError(f"rpc {part!r} is not host:port (e.g. 192.168.1.20:50052); separate "
                                     "servers with commas", param="rpc")
        endpoint = f"{m.group(1)}:{port}"
        if endpoint in out:
            raise InvalidOptionError(f"rpc names {endpoint} twice; each server once", param="rpc")
        out.append(endpoint)
    return tuple(out)


def parse_gpus(text: str, n_local: int | None) -> tuple[int, ...]:
    """``--gpus 0,1`` as indices of the local GPUs (llama.cpp's order); ``n_local`` checks the range
    (None: not known, e.g. planning for another machine). Raises InvalidOptionError (param ``gpus``)."""
    try:
        picked = tuple(int(p) for p in text.split(","))
    except ValueError:
        raise InvalidOptionError(f"gpus {text!r} is not a list of GPU numbers, e.g. 0,1", param="gpus") from None
    if len(set(picked)) != len(picked) or any(i < 0 for i in picked):
        raise InvalidOptionError(f"gpus {text!r} must name each GPU once, from 0", param="gpus")
    if n_local is not None and any(i >= n_local for i in picked):
        have = f"GPUs 0–{n_local - 1}" if n_local > 1 else ("GPU 0" if n_local else "no GPU")
        raise InvalidOptionError(f"gpus {text!r} names a GPU this machine lacks: llama.cpp sees {have} "
                                 "(see `localspec doctor`)", param="gpus")
    return picked


def draft_device(devices: Sequence[Device], room: Sequence[int], wanted: int | None) -> int | None:
    """The device the draft goes to: ``wanted`` (an index into ``devices``, which must be local), else
    the local one with the most ``room``; None when every device is remote (the draft then runs on
    this machine's CPU)."""
    if wanted is not None:
        if not 0 <= wanted < len(devices) or devices[wanted].remote:
            local = sum(not d.remote for d in devices)
            raise InvalidOptionError(f"draft_gpu {wanted} is not one of the {local} local GPUs in use",
                                     param="draft_gpu")
        return wanted
    local = [i for i, d in enumerate(devices) if not d.remote]
    return max(local, key=lambda i: (room[i], -i)) if local else None


def target_shares(room: Sequence[int], draft_bytes: int, draft_at: int | None) -> tuple[float, ...]:
    """Each device's share of the target's offloaded layers: in proportion to the memory it has left
    once the draft (``draft_bytes`` on device ``draft_at``) is placed. Equal shares when none is left."""
    left = [max(0, r - (draft_bytes if i == draft_at else 0)) for i, r in enumerate(room)]
    total = sum(left)
    if total == 0:
        return tuple(1.0 / len(room) for _ in room)
    return tuple(x / total for x in left)
