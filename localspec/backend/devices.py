"""The devices llama.cpp places a model's layers on: local GPUs and remote ggml RPC servers.

A remote device is an ``rpc-server`` (llama.cpp's tools/rpc) on another machine, added the way
llama.cpp's own ``--rpc`` adds it (common/arg.cpp): the RPC backend's
``ggml_backend_rpc_add_server`` proc address, then its devices in ``llama_model_params.devices``.
They are not registered with ggml, so only the model they are passed to (the target) uses them.

ggml's RPC client has no timeouts and aborts the process when a server cannot be reached or goes
away (``GGML_ABORT`` in ggml-rpc.cpp). So every server is first probed here with a bounded
handshake of our own (``probe``); once a model is loaded, ``bound_connections`` gives ggml's sockets
a timeout and keepalive, so a hung server fails instead of stalling; and ``on_fatal`` lets a front
end turn the abort that a server lost mid-reply still causes into its one line (the process ends
either way: the client's thread is already past recovery when ggml calls us).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import socket
import struct
import time
from typing import Callable, NoReturn, Sequence

from localspec.backend.build import ensure_init, native_library
from localspec.errors import RemoteDeviceError
from localspec.models.split import Device, parse_endpoints  # noqa: F401  (the backend's face)
from localspec.llama_facts import RPC_CMD_HELLO, RPC_CONN_CAPS_SIZE, RPC_DEFAULT_PORT, RPC_PROTO_VERSION

PROBE_TIMEOUT_S = 5.0
"""How long a probe waits for a connection and for the handshake's answer."""
REPLY_TIMEOUT_S = float(os.environ.get("LOCALSPEC_RPC_TIMEOUT_S", "300"))
"""The longest ggml's client waits for a server's reply once loaded (``bound_connections``): longer than
a slow server's largest graph (a 512-token prefill of its layers), short enough that a hung server ends
the reply instead of the process waiting forever. ``LOCALSPEC_RPC_TIMEOUT_S`` changes it."""


def probe(endpoint: str, timeout: float = PROBE_TIMEOUT_S) -> tuple[int, int, int]:
    """Connect to an rpc-server and say HELLO as ggml's client does, within ``timeout`` seconds for
    each; the server's protocol version. Raises RemoteDeviceError saying why it cannot be used."""
    host, _, port = endpoint.rpartition(":")
    try:
        sock = socket.create_connection((host, int(port)), timeout=timeout)
    except ConnectionRefusedError:
        raise RemoteDeviceError(f"RPC server {endpoint} refused the connection: nothing listens there; "
                                "start rpc-server on that machine (docs/rpc.md) or leave it out") from None
    except socket.timeout:
        raise RemoteDeviceError(f"RPC server {endpoint} did not answer within {timeout:g} s: check the address, "
                                "that the machine is up and that no firewall drops the port") from None
    except OSError as err:
        raise RemoteDeviceError(f"RPC server {endpoint} cannot be reached: {err.strerror or err}; check the "
                                "address") from None
    with sock:
        try:
            sock.sendall(bytes([RPC_CMD_HELLO]) + struct.pack("<Q", RPC_CONN_CAPS_SIZE) + bytes(RPC_CONN_CAPS_SIZE))
            head = _receive(sock, 8)
            size = struct.unpack("<Q", head)[0]
            if size != 4 + RPC_CONN_CAPS_SIZE:  # not a reply of ggml's RPC: say what answered instead
                raise RemoteDeviceError(f"{endpoint} is no rpc-server: {_what_answered(head)}; check the port "
                                        f"(rpc-server listens on {RPC_DEFAULT_PORT} unless told otherwise)")
            answer = head + _receive(sock, 4 + RPC_CONN_CAPS_SIZE)
        except socket.timeout:
            raise RemoteDeviceError(f"RPC server {endpoint} accepted the connection but did not answer the "
                                    f"handshake within {timeout:g} s: an rpc-server serves one client at a "
                                    "time, so another program may be using it (or it is no rpc-server)") from None
        except OSError as err:
            raise RemoteDeviceError(f"RPC server {endpoint} closed the connection during the handshake "
                                    f"({err.strerror or err}): is it an rpc-server?") from None
    version = tuple(answer[8:11])
    major, minor, _ = RPC_PROTO_VERSION
    if version[0] != major or version[1] > minor:
        raise RemoteDeviceError(f"RPC server {endpoint} speaks RPC protocol {'.'.join(map(str, version))}, this "
                                f"llama.cpp {'.'.join(map(str, RPC_PROTO_VERSION))}: build its rpc-server from "
                                "the same llama.cpp as llama-cpp-python's (docs/rpc.md)")
    return version  # type: ignore[return-value]


def _what_answered(head: bytes) -> str:
    """What a peer that is no rpc-server answered a handshake with: a protocol named by its first bytes
    (HTTP, SSH, ...), else the bytes themselves (a size of 10**18 bytes would say nothing)."""
    if head.startswith(b"HTTP/"):
        return "a web server (HTTP) answered"
    if head.startswith(b"SSH-"):
        return "an SSH server answered"
    return f"it answered {head!r}, not ggml's RPC handshake"


def _receive(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionResetError("the server closed the connection")
        data += chunk
    return data


@functools.cache
def _api() -> dict[str, Callable]:
    """ggml's registry and device functions from the loaded library (llama-cpp-python binds none)."""
    lib = native_library()
    sigs = {
        "ggml_backend_reg_by_name": ([ctypes.c_char_p], ctypes.c_void_p),
        "ggml_backend_reg_get_proc_address": ([ctypes.c_void_p, ctypes.c_char_p], ctypes.c_void_p),
        "ggml_backend_reg_dev_count": ([ctypes.c_void_p], ctypes.c_size_t),
        "ggml_backend_reg_dev_get": ([ctypes.c_void_p, ctypes.c_size_t], ctypes.c_void_p),
        "ggml_backend_dev_count": ([], ctypes.c_size_t),
        "ggml_backend_dev_get": ([ctypes.c_size_t], ctypes.c_void_p),
        "ggml_backend_dev_type": ([ctypes.c_void_p], ctypes.c_int),
        "ggml_backend_dev_name": ([ctypes.c_void_p], ctypes.c_char_p),
        "ggml_backend_dev_description": ([ctypes.c_void_p], ctypes.c_char_p),
        "ggml_backend_dev_memory": ([ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t),
                                     ctypes.POINTER(ctypes.c_size_t)], None),
        "ggml_set_abort_callback": ([ctypes.c_void_p], ctypes.c_void_p),
    }
    out = {}
    for name, (args, res) in sigs.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, res
        out[name] = fn
    return out


def _device(handle: int, *, remote: bool) -> Device:
    api = _api()
    free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
    api["ggml_backend_dev_memory"](handle, ctypes.byref(free), ctypes.byref(total))
    text = lambda raw: (raw or b"").decode("utf-8", errors="replace")  # noqa: E731
    return Device(text(api["ggml_backend_dev_name"](handle)), text(api["ggml_backend_dev_description"](handle)),
                  free.value, total.value, remote, handle)


_GPU_TYPES = (1, 2)  # enum ggml_backend_dev_type: CPU, GPU, IGPU, ACCEL, META (ggml-backend.h)


def local_gpus() -> list[Device]:
    """The GPUs of this machine llama.cpp can offload to, in its device order (RPC servers are never
    registered, so none is among them)."""
    ensure_init()
    api = _api()
    handles = (api["ggml_backend_dev_get"](i) for i in range(api["ggml_backend_dev_count"]()))
    return [_device(h, remote=False) for h in handles if h and api["ggml_backend_dev_type"](h) in _GPU_TYPES]


_ADD_SERVER = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_char_p)


def rpc_devices(endpoints: Sequence[str], timeout: float = PROBE_TIMEOUT_S) -> list[Device]:
    """The devices of each rpc-server at ``endpoints`` (each probed first, within ``timeout``), in order.
    Raises RemoteDeviceError when one cannot be used, before ggml's client (which would abort) touches it."""
    ensure_init()
    for endpoint in endpoints:
        probe(endpoint, timeout)
    api = _api()
    reg = api["ggml_backend_reg_by_name"](b"RPC")
    address = api["ggml_backend_reg_get_proc_address"](reg, b"ggml_backend_rpc_add_server") if reg else None
    if not address:
        raise RemoteDeviceError("this llama.cpp build has no RPC backend: rebuild it with scripts/setup.sh, "
                                "which turns GGML_RPC on")
    add_server = _ADD_SERVER(address)
    found = []
    for endpoint in endpoints:
        server = add_server(endpoint.encode())
        count = api["ggml_backend_reg_dev_count"](server) if server else 0
        if not count:
            raise RemoteDeviceError(f"RPC server {endpoint} offers no device: start it with one (-d) or none "
                                    "named (its CPU then serves)")
        found += [_device(api["ggml_backend_reg_dev_get"](server, i), remote=True) for i in range(count)]
    return found


def bound_connections(endpoints: Sequence[str], timeout: float = REPLY_TIMEOUT_S) -> int:
    """Give ggml's connections to ``endpoints`` a receive and send timeout and TCP keepalive; how many
    it found.

    ggml's client blocks in recv() with no timeout: a server that hangs, or a machine that drops off
    the network, would stall the reply forever. This process's sockets are found by their peer address
    (/proc/self/fd or /dev/fd) and set through a duplicate of each descriptor: past ``timeout`` (or
    when keepalive finds the peer gone, after about 25 s) recv() fails, ggml aborts and ``on_fatal``
    says so. Call it after a model is loaded: its buffers keep one connection per server open.
    """
    peers = set()
    for endpoint in endpoints:
        host, _, port = endpoint.rpartition(":")
        with contextlib.suppress(OSError):
            peers |= {(info[4][0], int(port)) for info in socket.getaddrinfo(host, int(port), socket.AF_INET)}
    folder = "/proc/self/fd" if os.path.isdir("/proc/self/fd") else "/dev/fd"
    seconds = struct.pack("ll", int(timeout), int((timeout % 1) * 1e6))
    found = 0
    for name in os.listdir(folder):
        try:
            sock = socket.socket(fileno=os.dup(int(name)))
        except (OSError, ValueError):
            continue
        with sock:
            try:
                if sock.family != socket.AF_INET or sock.getpeername() not in peers:
                    continue
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, seconds)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, seconds)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
                for option, value in (("TCP_KEEPIDLE", 10), ("TCP_KEEPINTVL", 5), ("TCP_KEEPCNT", 3)):
                    if hasattr(socket, option):
                        sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)
                found += 1
            except OSError:
                continue
    return found


# --- when a server goes away mid-reply -----------------------------------------------------------
_ABORT_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_char_p)
_installed: list = []  # the callback ggml holds, kept alive
_RPC_ABORTS = ("Remote RPC server", "Failed to connect to", "RPC handshake failed")


def on_fatal(handler: Callable[[RemoteDeviceError], NoReturn], endpoints: Sequence[str]) -> None:
    """Call ``handler`` when ggml is about to abort the process because one of ``endpoints`` failed.

    ggml's RPC client aborts when a server closes the connection or answers wrongly (it has no way to
    report an error back); ggml calls its abort callback first, on the client thread that noticed,
    and aborts when it returns. ``handler`` gets the error in one line and must end the process itself
    (``os._exit``) after its last words (saving a chat, restoring a terminal). Any other abort keeps
    ggml's own message.
    """
    def called(message: bytes) -> None:
        text = (message or b"").decode("utf-8", errors="replace")
        if not any(mark in text for mark in _RPC_ABORTS):
            import sys

            print(text, file=sys.stderr, flush=True)
            return
        handler(RemoteDeviceError(_what_went(endpoints)))

    callback = _ABORT_CALLBACK(called)
    _installed[:] = [callback]
    _api()["ggml_set_abort_callback"](ctypes.cast(callback, ctypes.c_void_p))


def _still_accepts(endpoint: str, *, probes: int = 3, pause_s: float = 0.2) -> bool:
    """Whether ``endpoint`` still listens: no probe over about a second is refused. One that serves us
    accepts without answering, or, its backlog full (an rpc-server takes one client at a time), lets the
    probe time out; only a refusal means nothing listens. A server killed mid-reply closes our connection a
    moment before its listening socket, so one probe right after the abort can still find it listening."""
    host, _, port = endpoint.rpartition(":")
    for i in range(probes):
        if i:
            time.sleep(pause_s)
        try:
            socket.create_connection((host, int(port)), timeout=1.0).close()
        except ConnectionRefusedError:
            return False
        except OSError:
            pass  # no answer in time: something listens there
    return True


def _what_went(endpoints: Sequence[str]) -> str:
    gone = [endpoint for endpoint in endpoints if not _still_accepts(endpoint)]
    if gone:
        return (f"RPC server {', '.join(gone)} went away mid-reply (the connection closed); llama.cpp cannot "
                "continue without it: restart rpc-server there and run again")
    return (f"RPC server {' or '.join(endpoints)} stopped answering mid-reply (no reply within "
            f"{REPLY_TIMEOUT_S:g} s, or the connection broke); llama.cpp cannot continue without it: check "
            "that machine, restart rpc-server there and run again")
