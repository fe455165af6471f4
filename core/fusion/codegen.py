"""Kernel generation for fused pointwise work: chains of the plugins' scalar device functions.

A fused group is an :class:`Program`: leaves (the tensors it reads), steps (one plugin
device function each, reading leaves or earlier steps) and results (the steps it
stores). Two generators share it:

- :func:`chain_tactics`: grid-stride kernels computing every result for each element of
  the output shape (pointwise-chain fusion; a single pointwise op is a one-step chain),
  scalar and, for float32, with 16-byte vector loads and stores;
- :func:`epilogue`: a device function that an anchor tactic (Conv, Gemm, MatMul) calls on
  each value before its store (epilogue fusion).

Leaves are read by how they broadcast: a leaf laid out like the output reads element
``i``, a one-element leaf is read once, others through strides decoded from ``i``. The
math is the plugins'; this module only writes the loads, the calls and the stores.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np
from numba import cuda

from plugrt.kernels import VECTOR, Epilogue, aligned, broadcast_strides, elementwise_grid, flat, jit, to_device
from plugrt.tactic import Launch, Tactic

SAME, SCALAR, STRIDED = "same", "scalar", "strided"


@dataclass(frozen=True)
class Step:
    """``fn(*args)``; an arg is ``("leaf", k)``, ``("step", j)`` or ``("value",)`` (the
    anchor's value, in an epilogue)."""

    fn: Callable
    args: tuple


@dataclass(frozen=True)
class Program:
    leaves: tuple  # TensorInfo of each leaf (concrete shapes), aligned with ``ins``; None: not read
    steps: tuple[Step, ...]
    results: tuple[int, ...]  # step indices stored, in output order


def leaf_kind(info, out_shape: Sequence[int]) -> str | None:
    if info is None:
        return None
    size = int(np.prod(info.shape, dtype=np.int64))
    if size == 1:
        return SCALAR
    if size == int(np.prod(out_shape, dtype=np.int64)):
        return SAME  # the output's shape, maybe with leading 1s: same flat layout
    return STRIDED


def _body(program: Program, kinds: Sequence[str], ndim: int, value: str | None, u: str = "") -> tuple[list, list]:
    """Source lines for one element ``i{u}``: (loads, calls). Loads decode strided offsets
    and read the leaves; calls apply the steps in order. ``u`` suffixes every name, so
    several elements' loads can all be issued before their calls (unrolling).

    Leaf ``k`` is the array ``x{k}``; strided leaf number ``s`` reads its strides from
    ``table[ndim * (1 + s) + d]`` (``table[:ndim]`` is the output shape).
    """
    loads = []
    strided = [k for k, kind in enumerate(kinds) if kind == STRIDED]
    if strided:
        loads += [f"r = i{u}"] + [f"p{k}{u} = 0" for k in strided]
        loads += [f"for d in range({ndim - 1}, -1, -1):", "    c = r % table[d]", "    r //= table[d]"]
        loads += [f"    p{k}{u} += c * table[{ndim * (1 + s)} + d]" for s, k in enumerate(strided)]
    for k, kind in enumerate(kinds):
        if kind in (SAME, STRIDED):
            index = f"i{u}" if kind == SAME else f"p{k}{u}"
            loads.append(f"a{k}{u} = {_load(program.leaves[k], f'x{k}[{index}]')}")
    calls = []
    for j, step in enumerate(program.steps):
        args = ", ".join(_ref(a, value, kinds, u) for a in step.args)
        calls.append(f"t{j}{u} = f{j}({args})")
    return loads, calls


def _load(info, expr: str) -> str:
    return f"float32({expr})" if np.dtype(info.dtype) == np.float16 else expr


def _ref(arg: tuple, value: str | None, kinds: Sequence[str], u: str) -> str:
    if arg[0] == "leaf":
        return f"a{arg[1]}" if kinds[arg[1]] == SCALAR else f"a{arg[1]}{u}"
    if arg[0] == "step":
        return f"t{arg[1]}{u}"
    return value


def _table(program: Program, kinds: Sequence[str], out_shape: tuple[int, ...]) -> np.ndarray:
    parts = [np.asarray(out_shape, np.int64)]
    parts += [broadcast_strides(program.leaves[k].shape, out_shape) for k, kind in enumerate(kinds) if kind == STRIDED]
    return np.concatenate(parts).astype(np.int64)


_compiled: dict = {}


def _compile(source: str, fns: tuple, name: str, device: bool):
    """Compile generated source once per (source, device functions)."""
    key = (source, fns, device)
    if key not in _compiled:
        namespace: dict[str, Any] = {"cuda": cuda, "float32": np.float32, "int64": np.int64}
        namespace.update({f"f{j}": fn for j, fn in enumerate(fns)})
        exec(compile(source, f"<plugrt {name}>", "exec"), namespace)
        _compiled[key] = jit(device=True)(namespace[name]) if device else jit(namespace[name])
    return _compiled[key]


def _kernel_header(program: Program, kinds: Sequence[str]) -> list[str]:
    """``def kernel(n, table, *outputs, *leaves):`` and the one-element leaves' loads."""
    leaves = ", ".join(f"x{k}" for k, kind in enumerate(kinds) if kind is not None)
    stores = ", ".join(f"o{r}" for r in range(len(program.results)))
    lines = [f"def kernel(n, table, {stores}{', ' if leaves else ''}{leaves}):"]
    return lines + [f"    a{k} = {_load(program.leaves[k], f'x{k}[0]')}" for k, kind in enumerate(kinds) if kind == SCALAR]


#: Elements each thread handles per loop trip when no leaf needs strided offsets: their
#: loads are all issued before the first store, keeping enough bytes in flight to
#: saturate HBM with scalar loads.
UNROLL = 4


def chain_kernel(program: Program, out_shape: tuple[int, ...], unroll: int, kinds: list | None = None):
    """The generated kernel ``kernel(n, table, *outputs, *leaves)`` and its leaf kinds
    (given, or each leaf's at these shapes)."""
    kinds = kinds if kinds is not None else [leaf_kind(info, out_shape) for info in program.leaves]
    ndim = len(out_shape)
    lines = _kernel_header(program, kinds)
    lines += ["    stride = int64(cuda.gridsize(1))", f"    for i in range(int64(cuda.grid(1)), n, stride * {unroll}):"]
    if unroll > 1:  # all elements in range: loads first, then calls and stores
        lines += [f"        i{u} = i + {u} * stride" for u in range(unroll)]
        lines += [f"        if i{unroll - 1} < n:"]
        parts = [_body(program, kinds, ndim, None, str(u)) for u in range(unroll)]
        lines += ["            " + line for loads, _ in parts for line in loads]
        lines += ["            " + line for _, calls in parts for line in calls]
        lines += [f"            o{r}[i{u}] = t{step}{u}" for u in range(unroll) for r, step in enumerate(program.results)]
        lines += ["            continue"]
    lines += [f"        for i_ in range(i, min(i + {unroll} * stride, n), stride):"]  # the last, partial trip
    loads, calls = _body(program, kinds, ndim, None, "_")
    lines += ["            " + line for line in loads + calls]
    lines += [f"            o{r}[i_] = t{step}_" for r, step in enumerate(program.results)]
    return _compile("\n".join(lines) + "\n", tuple(s.fn for s in program.steps), "kernel", device=False), kinds


def vector_kernel(program: Program, out_shape: tuple[int, ...], unroll: int):
    """The generated kernel ``kernel(n, table, *outputs, *leaves)`` reading and writing
    float32 four elements at a time (16-byte ``ld.v4``/``st.v4``), ``unroll`` vectors per
    thread and loop trip; elements past the last whole vector go through a scalar tail.
    Only for programs without strided leaves (see :func:`vectorizable`)."""
    kinds = [leaf_kind(info, out_shape) for info in program.leaves]
    ndim = len(out_shape)
    lines = _kernel_header(program, kinds)
    lines += ["    start = int64(cuda.grid(1))", "    stride = int64(cuda.gridsize(1))", "    vectors = n // 4",
              f"    for v in range(start, vectors, stride * {unroll}):"]
    lanes = [(w, lane) for w in range(unroll) for lane in range(4)]
    lines += [f"        v{w} = v + {w} * stride" for w in range(unroll)]
    lines += [f"        if v{unroll - 1} < vectors:"]
    lines += [f"            {', '.join(f'a{k}_{w}_{lane}' for lane in range(4))} = load4(x{k}, 4 * v{w})"
              for w in range(unroll) for k, kind in enumerate(kinds) if kind == SAME]
    lines += ["            " + line for w, lane in lanes for line in _body(program, kinds, ndim, None, f"_{w}_{lane}")[1]]
    lines += [f"            store4(o{r}, 4 * v{w}, {', '.join(f't{step}_{w}_{lane}' for lane in range(4))})"
              for w in range(unroll) for r, step in enumerate(program.results)]
    lines += ["            continue"]
    lines += [f"        for i_ in range(4 * v, min(4 * (v + {unroll} * stride), 4 * vectors), 4 * stride):"]
    lines += [f"            {', '.join(f'a{k}_{lane}' for lane in range(4))} = load4(x{k}, i_)"
              for k, kind in enumerate(kinds) if kind == SAME]
    lines += ["            " + line for lane in range(4) for line in _body(program, kinds, ndim, None, f"_{lane}")[1]]
    lines += [f"            store4(o{r}, i_, {', '.join(f't{step}_{lane}' for lane in range(4))})"
              for r, step in enumerate(program.results)]
    lines += ["    for i_ in range(4 * vectors + start, n, stride):"]  # the tail, n % 4 elements
    loads, calls = _body(program, kinds, ndim, None, "_")
    lines += ["        " + line for line in loads + calls]
    lines += [f"        o{r}[i_] = t{step}_" for r, step in enumerate(program.results)]
    from plugrt.kernels import vector4

    load4, store4 = vector4()
    fns = tuple(s.fn for s in program.steps) + (load4, store4)
    source = "\n".join(lines) + "\n"
    return _compile(source.replace("load4(", f"f{len(fns) - 2}(").replace("store4(", f"f{len(fns) - 1}("), fns,
                    "kernel", device=False), kinds


def _vector8_body(program: Program, kinds: Sequence[str], ndim: int, index: str, w: str,
                  value: str | None = None) -> list[str]:
    """Source lines computing the :data:`VECTOR` elements from ``index`` (a multiple of 8)
    and, in a kernel (no ``value``), storing them: float16/float32 leaves laid out like the
    output by 16-byte vectors, strided ones through one offset decoded for ``index`` plus
    the last axis's stride. ``value``: an epilogue's anchor values are ``{value}_0..7``."""
    lanes = range(VECTOR)
    strided = [k for k, kind in enumerate(kinds) if kind == STRIDED]
    lines = []
    if strided:
        lines += [f"r = {index}"] + [f"p{k}{w} = 0" for k in strided]
        lines += [f"for d in range({ndim - 1}, -1, -1):", "    c = r % table[d]", "    r //= table[d]"]
        lines += [f"    p{k}{w} += c * table[{ndim * (1 + s)} + d]" for s, k in enumerate(strided)]
    for k, kind in enumerate(kinds):
        if kind == SAME and np.dtype(program.leaves[k].dtype) in (np.float16, np.float32):
            lines.append(f"{', '.join(f'a{k}{w}_{u}' for u in lanes)} = load8(x{k}, {index})")
        elif kind == SAME:
            lines += [f"a{k}{w}_{u} = {_load(program.leaves[k], f'x{k}[{index} + {u}]')}" for u in lanes]
        elif kind == STRIDED:
            step = f"table[{ndim * (1 + strided.index(k)) + ndim - 1}]"
            lines += [f"a{k}{w}_{u} = {_load(program.leaves[k], f'x{k}[p{k}{w} + {u} * {step}]')}" for u in lanes]
    for u in lanes:
        anchor = None if value is None else f"{value}_{u}"
        for j, step in enumerate(program.steps):
            lines.append(f"t{j}{w}_{u} = f{j}({', '.join(_ref(a, anchor, kinds, f'{w}_{u}') for a in step.args)})")
    if value is None:
        lines += [f"store8(o{r}, {index}, ({', '.join(f't{step}{w}_{u}' for u in lanes)}))"
                  for r, step in enumerate(program.results)]
    return lines


def vector8_kernel(program: Program, out_shape: tuple[int, ...], unroll: int):
    """The generated kernel ``kernel(n, table, *outputs, *leaves)`` moving eight elements
    at a time (:func:`plugrt.kernels.vector8`: 16 bytes of float16, 32 of float32) for
    float16/float32 outputs, ``unroll`` vectors per thread and trip; elements past the last
    whole vector go through a scalar tail. Strided leaves only where the last axis is a
    multiple of 8 (see :func:`vectorizable8`)."""
    kinds = [leaf_kind(info, out_shape) for info in program.leaves]
    ndim = len(out_shape)
    lines = _kernel_header(program, kinds)
    lines += ["    start = int64(cuda.grid(1))", "    stride = int64(cuda.gridsize(1))", f"    vectors = n // {VECTOR}",
              f"    for v in range(start, vectors, stride * {unroll}):"]
    lines += [f"        i{w} = {VECTOR} * (v + {w} * stride)" for w in range(unroll)]
    lines += [f"        if v + {unroll - 1} * stride < vectors:"]
    lines += ["            " + line for w in range(unroll) for line in _vector8_body(program, kinds, ndim, f"i{w}", f"_{w}")]
    lines += ["            continue"]
    lines += [f"        for e in range(v, min(v + {unroll} * stride, vectors), stride):"]
    lines += ["            ie = e * 8"] + ["            " + line for line in _vector8_body(program, kinds, ndim, "ie", "_e")]
    lines += [f"    for i_ in range({VECTOR} * vectors + start, n, stride):"]  # the tail, n % 8 elements
    loads, calls = _body(program, kinds, ndim, None, "_")
    lines += ["        " + line for line in loads + calls]
    lines += [f"        o{r}[i_] = t{step}_" for r, step in enumerate(program.results)]
    from plugrt.kernels import vector8

    load8, store8 = vector8()
    fns = tuple(s.fn for s in program.steps) + (load8, store8)
    source = "\n".join(lines) + "\n"
    source = source.replace("load8(", f"f{len(fns) - 2}(").replace("store8(", f"f{len(fns) - 1}(")
    return _compile(source, fns, "kernel", device=False), kinds


def vectorizable8(program: Program, outputs: Sequence[Any]) -> bool:
    """Whether :func:`vector8_kernel` applies and pays: float16/float32 outputs, something
    in float16 (float32 alone has the 4-wide kernel), at least one vector, and strided
    leaves only where the output's last axis is a multiple of 8."""
    out_shape = tuple(int(d) for d in outputs[0].shape) or (1,)
    kinds = [leaf_kind(info, out_shape) for info in program.leaves]
    dtypes = [np.dtype(o.dtype) for o in outputs] + [np.dtype(i.dtype) for i, k in zip(program.leaves, kinds) if k]
    return (all(np.dtype(o.dtype) in (np.float16, np.float32) for o in outputs) and np.dtype(np.float16) in dtypes
            and int(np.prod(out_shape, dtype=np.int64)) >= VECTOR and (STRIDED not in kinds or out_shape[-1] % VECTOR == 0))


def vectorizable(program: Program, outputs: Sequence[Any]) -> bool:
    """Whether :func:`vector_kernel` applies: float32 outputs and full-size leaves, no
    strided leaf."""
    out_shape = tuple(int(d) for d in outputs[0].shape) or (1,)
    kinds = [leaf_kind(info, out_shape) for info in program.leaves]
    return (STRIDED not in kinds and all(np.dtype(o.dtype) == np.float32 for o in outputs)
            and all(np.dtype(info.dtype) == np.float32 for info, kind in zip(program.leaves, kinds) if kind == SAME))


#: Vectors per thread and trip of the float32 vector tactics the chain generator offers.
VECTOR_UNROLLS = (1, 2)


def chain_tactics(program: Program, outputs: Sequence[Any], name: str = "pointwise",
                  wanted: Mapping | None = None) -> list[Tactic]:
    """Every tactic for ``program``: the scalar grid-stride kernel first, then (where
    :func:`vectorizable`) the 16-byte vector variants the tuner may prefer, and last the
    ``general`` one, whose code is the same at every shape of the same ranks (the kernel a
    dynamic profile's other shapes run, :mod:`plugrt.engine.generic`). ``wanted``: only the
    one of that identity's name (:meth:`plugrt.registry.Registry.tactics`)."""
    named = (lambda label: True) if wanted is None else (lambda label: label == wanted["name"])
    found = [chain_tactic(program, outputs, name)] if named(name) else []
    if vectorizable(program, outputs) and int(np.prod([int(d) for d in outputs[0].shape], dtype=np.int64)) >= 4:
        found += [chain_tactic(program, outputs, f"{name}_vec4x{unroll}", unroll, vector=True)
                  for unroll in VECTOR_UNROLLS if named(f"{name}_vec4x{unroll}")]
    elif vectorizable8(program, outputs):
        found += [chain_tactic(program, outputs, f"{name}_vec8x{unroll}", unroll, vector=VECTOR)
                  for unroll in VECTOR_UNROLLS if named(f"{name}_vec8x{unroll}")]
    general = f"{name}_general"
    return found + ([chain_tactic(program, outputs, general, 1, general=True)] if named(general) else [])


def chain_tactic(program: Program, outputs: Sequence[Any], name: str = "pointwise", unroll: int | None = None,
                 vector: int = 0, general: bool = False) -> Tactic:
    """A tactic computing ``program``'s results elementwise over the outputs' shape.

    With ``vector`` 4 (only where :func:`vectorizable`), elements go four at a time through
    16-byte float32 loads and stores; with 8 (where :func:`vectorizable8`) eight at a time
    through :func:`plugrt.kernels.vector8`; ``unroll`` vectors per trip. On arrays that
    are not 16-byte aligned it launches the scalar kernel instead. ``general``: every
    leaf but a rank-0 one read through its strides, whatever its shape at these shapes.
    """
    out_shape = tuple(int(d) for d in outputs[0].shape) or (1,)
    kinds = [leaf_kind(info, out_shape) for info in program.leaves]
    if general:
        kinds = [None if info is None else SCALAR if len(info.shape) == 0 else STRIDED for info in program.leaves]
    vector = 4 if vector is True else int(vector)
    if unroll is None:
        unroll = 1 if STRIDED in kinds else UNROLL
    if vector:
        kernel, kinds = (vector8_kernel if vector == VECTOR else vector_kernel)(program, out_shape, unroll)
        scalar, _ = chain_kernel(program, out_shape, 1 if STRIDED in kinds else UNROLL)
    else:
        kernel, kinds = chain_kernel(program, out_shape, unroll, kinds if general else None)
    table = _table(program, kinds, out_shape)

    def launches(ins, outs, workspace):
        n = int(np.prod(out_shape, dtype=np.int64))
        stored = [flat(o) for o in outs]
        read = [(flat(x), kind) for x, kind in zip(ins, kinds) if kind is not None]
        args = (np.int64(n), to_device(table), *stored, *(x for x, _ in read))
        if vector and all(map(aligned, stored + [x for x, kind in read if kind == SAME])):
            blocks, threads = elementwise_grid(-(-n // vector), unroll)
            return [Launch(kernel, blocks, threads, args)]
        blocks, threads = elementwise_grid(n, (1 if STRIDED in kinds else UNROLL) if vector else unroll)
        return [Launch(scalar if vector else kernel, blocks, threads, args)]

    params = {"unroll": unroll, "vector": vector} if vector else {"unroll": unroll}
    return Tactic(name, launches, {**params, "general": True} if general else params)


def epilogue(program: Program, out_shape: Sequence[int], first: int, label: str = "") -> Epilogue:
    """The :class:`~plugrt.kernels.Epilogue` applying ``program`` (one result) to an
    anchor's value; its leaves are the anchor's extra inputs, from ``ins[first]`` on."""
    out_shape = tuple(int(d) for d in out_shape) or (1,)
    kinds = [leaf_kind(info, out_shape) for info in program.leaves]
    lines = ["def epilogue(value, i, operands):", "    table = operands[0]"]
    lines += [f"    x{k} = operands[{k + 1}]" for k in range(len(kinds))]  # every epilogue leaf is read
    lines += [f"    a{k} = {_load(program.leaves[k], f'x{k}[0]')}" for k, kind in enumerate(kinds) if kind == SCALAR]
    loads, calls = _body(program, kinds, len(out_shape), "value", "")
    lines += ["    " + line for line in loads + calls]
    lines += [f"    return t{program.results[0]}"]
    fn = _compile("\n".join(lines) + "\n", tuple(s.fn for s in program.steps), "epilogue", device=True)
    vector, vector_operands = (None, ()) if out_shape[-1] % VECTOR else vector_epilogue(program, out_shape, kinds)
    return Epilogue(fn, first, _table(program, kinds, out_shape), label, vector, vector_operands)


def vector_epilogue(program: Program, out_shape: tuple[int, ...], kinds: Sequence[str]) -> tuple[Callable, tuple]:
    """``(vector, operands loaded by vectors)``: the epilogue for :data:`VECTOR` elements
    ``i .. i + 7`` of one last-axis row (``i`` a multiple of :data:`VECTOR`), its loads
    and calls as :func:`vector8_kernel`'s (:func:`_vector8_body`)."""
    vectored = tuple(k for k, kind in enumerate(kinds)
                     if kind == SAME and np.dtype(program.leaves[k].dtype) in (np.float16, np.float32))
    lines = ["def epilogue(values, i, operands):", "    table = operands[0]"]
    lines += [f"    x{k} = operands[{k + 1}]" for k in range(len(kinds))]
    lines += [f"    a{k} = {_load(program.leaves[k], f'x{k}[0]')}" for k, kind in enumerate(kinds) if kind == SCALAR]
    lines.append(f"    {', '.join(f'v_{u}' for u in range(VECTOR))} = values")
    lines += ["    " + line for line in _vector8_body(program, kinds, len(out_shape), "i", "", value="v")]
    lines.append(f"    return ({', '.join(f't{program.results[0]}_{u}' for u in range(VECTOR))})")
    from plugrt.kernels import vector8

    load8 = vector8()[0]
    fns = tuple(s.fn for s in program.steps) + (load8,)
    source = "\n".join(lines).replace("load8(", f"f{len(fns) - 1}(") + "\n"
    return _compile(source, fns, "epilogue", device=True), vectored


def pointwise_tactic(fn: Callable, inputs: Sequence[Any], output: Any, name: str = "pointwise") -> Tactic:
    """A tactic that computes ``output = fn(*inputs)`` elementwise with broadcasting.

    :param fn: a ``@jit(device=True)`` scalar function taking one argument per present
        input (omitted optional inputs, ``None`` in ``inputs``, are skipped). float16
        inputs arrive widened to float32; the result is cast to the output's dtype.
    :param inputs: the node's input ``TensorInfo`` (concrete shapes), ``None`` for omitted.
    :param output: the output ``TensorInfo``.
    """
    step = Step(fn, tuple(("leaf", k) for k, info in enumerate(inputs) if info is not None))
    return chain_tactic(Program(tuple(inputs), (step,), (0,)), [output], name)


def pointwise_tactics(fn: Callable, inputs: Sequence[Any], output: Any, name: str = "pointwise",
                      wanted: Mapping | None = None) -> list[Tactic]:
    """:func:`pointwise_tactic` first, then its 16-byte vector variants where they apply
    (:func:`chain_tactics`); the tuner times them. ``wanted``: as for :func:`chain_tactics`."""
    step = Step(fn, tuple(("leaf", k) for k, info in enumerate(inputs) if info is not None))
    return chain_tactics(Program(tuple(inputs), (step,), (0,)), [output], name, wanted)
