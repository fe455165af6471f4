"""The built-in op plugins of plugrt, one package per op family.

Each family package (``activation``, ``elementwise``, ``conv``, ``matmul``,
``normalization``, ``pooling``, ``quant``, ``recurrent``, ``reduction``, ``shape``,
``spatial``) is registered through
its own entry point ``builtin-<family>`` in group ``plugrt.plugins``, exactly as a
third-party plugin is; the core never imports this package. Its ``__init__.py`` holds the
family's one ``plugrt_ops`` hook (every op of the family) and its ``PLUGRT_API``, and lists
the family's modules.

Module names say what a module holds:

- op modules hold the OpPlugin classes: ``ops.py`` in every family (open it first), and
  where one file would grow past ~450 lines, further ones named ``<topic>_ops.py``
  (``elementwise/cast_ops.py``, ``shape/generator_ops.py``, ``spatial/resize_ops.py``, ...);
- ``tactics.py``, where a family has several kinds of kernels to choose among (``conv``,
  ``matmul``), chooses and orders them; the op modules reach those kernels through it;
- every other module holds kernels (or their device functions and host-side planning) and is
  named for what it computes: ``conv/implicit_gemm.py``, ``conv/depthwise.py``,
  ``matmul/wgmma.py``, ``reduction/softmax.py``, ``elementwise/device_functions.py``, ...

What several families share lives in :mod:`plugrt_builtin_ops.common` (no entry point); a
family imports another family's public names only (the TF32 conv reuses the matmul family's
TF32 tile configuration and warp step), never a private ``_name``.
"""
