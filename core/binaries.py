"""Compiled kernels: where a launch's CUDA function comes from.

:func:`function` turns a kernel and its argument types into a CUDA function handle. Today
it compiles with Numba (NVVM, then the linker): seconds per kernel. The kernel cache and
the kernels stored in plan files hang off ``key``, a string that names the kernel's code
exactly (see :mod:`plugrt.tuning.kernel_keys`); a launch without a key is compiled.
"""

from __future__ import annotations

import threading

_lock = threading.RLock()


def function(kernel, argtypes: tuple, key: str | None = None):
    """The ``CUfunction`` that runs ``kernel`` for ``argtypes`` on the current device."""
    from cuda.bindings import driver as drv

    with _lock:
        compiled = kernel.compile(argtypes)
        cufunc = compiled._codelibrary.get_cufunc()
    err, handle = drv.cuKernelGetFunction(cufunc.handle)
    if err != drv.CUresult.CUDA_SUCCESS:
        from plugrt.errors import PlugrtError

        raise PlugrtError(f"cuKernelGetFunction failed: {err}")
    return handle
