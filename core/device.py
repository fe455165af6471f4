"""Which CUDA backend plugrt runs on: a real GPU, or Numba's CUDA simulator.

The choice must be made before anything imports ``numba.cuda``, because the simulator is
switched on by the environment variable ``NUMBA_ENABLE_CUDASIM`` read at that import.
:func:`select_backend` runs when ``plugrt`` is imported (plugins import ``plugrt`` before
they import ``numba.cuda``): it probes the CUDA driver through ``ctypes`` and, when no
GPU answers, turns the simulator on. A value the user set for ``NUMBA_ENABLE_CUDASIM``
is always respected.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading

_SIM_VARIABLE = "NUMBA_ENABLE_CUDASIM"
_announced = False


def gpu_present() -> bool:
    """True when the CUDA driver loads and reports at least one device."""
    for name in ("libcuda.so.1", "libcuda.so", "nvcuda.dll"):
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        count = ctypes.c_int(0)
        try:
            if lib.cuInit(0) != 0 or lib.cuDeviceGetCount(ctypes.byref(count)) != 0:
                return False
        except AttributeError:
            return False
        return count.value > 0
    return False


def select_backend() -> None:
    """Turn Numba's CUDA simulator on when there is no GPU (unless the user chose)."""
    if _SIM_VARIABLE in os.environ:
        return
    if "numba.cuda" in sys.modules:
        return  # too late to choose; whatever numba.cuda decided stands
    if not gpu_present():
        os.environ[_SIM_VARIABLE] = "1"


def simulated() -> bool:
    """True when kernels run in Numba's CUDA simulator."""
    from numba.cuda import config

    return bool(config.ENABLE_CUDASIM)


_shared_guarded = False


def guard_simulator() -> None:
    """Make the simulator's shared arrays shared (idempotent; nothing on a GPU).

    Numba's simulator runs a block's threads as Python threads, and ``cuda.shared.array``
    finds a block's array in a dict by call site: look up, allocate if missing, store, with
    no lock. A thread switch between the look-up and the store (under load: CI's two cores
    with a server beside them) gives two threads of one block arrays of their own, so one
    thread's stores are lost to the others and a tiled kernel returns a wrong row now and
    then (seen as a flaky serving test). The look-up and store run under one lock here."""
    global _shared_guarded
    if _shared_guarded or not simulated():
        return
    import traceback

    from numba.core import types
    from numba.np import numpy_support
    from numba.cuda.simulator import kernelapi

    unguarded = kernelapi.FakeCUDAShared.array
    lock = threading.Lock()

    def array(self, shape, dtype, alignment=None):  # (the simulator's own, with the lock)
        if alignment is not None or shape == 0:  # (an error; dynamic shared memory: no look-up)
            return unguarded(self, shape, dtype, alignment)
        if isinstance(dtype, types.Type):
            dtype = numpy_support.as_dtype(dtype)
        caller = tuple(traceback.extract_stack(sys._getframe(1), limit=1)[-1])[0:2]
        with lock:
            found = self._allocations.get(caller)
            if found is None:
                found = self._allocations[caller] = kernelapi.np.empty(shape, dtype)
        return found

    kernelapi.FakeCUDAShared.array = array
    _shared_guarded = True


def announce_once(stream=None) -> None:
    """Print once per process that kernels run in the simulator (the CLI calls this)."""
    global _announced
    if _announced or not simulated():
        return
    _announced = True
    print("plugrt: no GPU found; kernels run in Numba's CUDA simulator (slow, for testing)",
          file=stream or sys.stderr)


def memory_bytes() -> int | None:
    """The current device's total memory in bytes; ``None`` in the simulator or when unknown."""
    if simulated():
        return None
    try:
        from numba import cuda

        return int(cuda.current_context().get_memory_info().total)
    except Exception:  # noqa: BLE001 - no device to ask: the builder's own limit applies
        return None


def describe() -> dict:
    """The device an engine is built on, as recorded in plan files."""
    if simulated():
        return {"name": "Numba CUDA simulator", "compute_capability": None, "simulator": True}
    from numba import cuda

    device = cuda.get_current_device()
    name = device.name.decode() if isinstance(device.name, bytes) else str(device.name)
    return {"name": name, "compute_capability": list(device.compute_capability), "simulator": False}


# --------------------------------------------------------------------------- several GPUs


def device_count() -> int:
    """How many GPUs this process sees (CUDA_VISIBLE_DEVICES applies); 1 in the simulator."""
    if simulated():
        return 1
    from numba import cuda

    return len(cuda.gpus)


def current_device_id() -> int:
    """The id of the device current in the calling thread (0 in the simulator)."""
    if simulated():
        return 0
    from numba import cuda

    return int(cuda.get_current_device().id)


def check_devices(devices) -> list[int]:
    """``devices`` as a list of distinct device ids this process sees, or a
    :class:`PlugrtError` naming the one at fault."""
    from plugrt.errors import PlugrtError

    found, count = [], device_count()
    for device in devices:
        if isinstance(device, bool) or not isinstance(device, int) or device < 0:
            raise PlugrtError(f"device {device!r}: a device is a whole number >= 0 (as nvidia-smi numbers them)")
        if device >= count:
            seen = "the CUDA simulator's one device (0)" if simulated() else f"{count} GPU(s), 0 to {count - 1}"
            raise PlugrtError(f"device {device}: this process sees {seen}; name one of those (CUDA_VISIBLE_DEVICES "
                              "decides which GPUs a process sees)")
        if device in found:
            raise PlugrtError(f"device {device} is listed twice; list each device once (--streams gives a device "
                              "several contexts)")
        found.append(device)
    if not found:
        raise PlugrtError("no device listed; name at least one, e.g. 0")
    return found


def make_current(device_id: int) -> None:
    """Make device ``device_id``'s primary CUDA context (Numba's) current in the calling
    thread, so that what the thread allocates and launches next goes to that device."""
    if simulated():
        return
    from numba import cuda
    from numba.cuda.cudadrv.driver import driver

    if int(device_id) == 0 and len(cuda.gpus) == 1:
        cuda.current_context()  # (one GPU: Numba's own way, pushing its primary context once per thread)
        return
    context = cuda.gpus[int(device_id)].get_primary_context()
    driver.cuCtxSetCurrent(context.handle)
    context.prepare_for_use()


def identify(device_id: int | None = None) -> dict:
    """Which GPU a device id is: its id, name and PCI bus id (what nvidia-smi shows), so a
    report can confirm where each context or replica ran."""
    if simulated():
        return {"id": 0, "name": "Numba CUDA simulator", "pci_bus_id": None}
    from numba import cuda

    device = cuda.gpus[current_device_id() if device_id is None else int(device_id)]
    name = device.name.decode() if isinstance(device.name, bytes) else str(device.name)
    try:
        bus = f"{device.PCI_DOMAIN_ID:04x}:{device.PCI_BUS_ID:02x}:{device.PCI_DEVICE_ID:02x}.0"
    except Exception:  # noqa: BLE001 - a driver that does not say: the report goes on without it
        bus = None
    return {"id": int(device.id), "name": name, "pci_bus_id": bus}


_thread_state = threading.local()


def ensure_current(device_id: int) -> None:
    """Raw driver calls need a context's device current on the calling thread: a thread's
    first call makes it so. Where the process sees several GPUs, every call makes it so
    (one driver call): the thread may have moved to another device since, through another
    context or the caller's own code."""
    if not getattr(_thread_state, "ready", False) or _thread_state.several:
        _thread_state.several = not simulated() and device_count() > 1
        make_current(device_id)
        _thread_state.ready = True
