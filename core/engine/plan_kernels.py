"""Compiled kernels inside plan files: what ``save`` stores and ``load`` hands the kernel store.

A plan's ``kernels`` header section maps each kernel's full key
(:func:`plugrt.binaries.full_key`) to its entry point and two raw arrays, the cubin and
the PTX, named by the sha256 of their bytes (``kernel/HEX``), so identical code is stored
once, and covered by the plan's checksum like the weights. ``check`` binds a record to its
key (:func:`plugrt.engine.plan_schema.kernel_record_check`), so that a record that moved
under another key is refused, not run as the wrong kernel::

    "kernels": {"arch": "sm_90a", "functions": {FULL_KEY: {"entry": NAME, "cubin": "kernel/HEX",
                                                           "ptx": "kernel/HEX", "check": HEX16}}}

``arch`` is the build GPU's architecture (``null`` with no functions, as in the simulator).
The kernels stored are those of each profile's specializations at its opt shapes (the one
every context prepares first) and at its probe shapes (:func:`specializations`: the
generic tactics', whose kernels serve every other shape of the profile): saving on a GPU
makes a context per profile, which loads or compiles each kernel, and takes their
binaries from the store. A plan without the section (older
plugrt) loads and compiles its kernels. On a GPU of another architecture the kernels are
compiled again from the installed plugins (:func:`plugrt.binaries.supply` warns once).
"""

from __future__ import annotations

import hashlib

import numpy as np

from plugrt import binaries
from plugrt.device import simulated
from plugrt.engine.generic import Probe, launch_key, probes
from plugrt.engine.plan_schema import kernel_record_check
from plugrt.kernel_cache import KernelBinary

#: Raw arrays of kernel code are named ``kernel/`` + the sha256 of their bytes.
ARRAY_PREFIX = "kernel/"


def collect(engine) -> tuple[dict, dict[str, np.ndarray]]:
    """The ``kernels`` section and its arrays for ``engine``'s plan; empty in the simulator."""
    if simulated():
        return {"arch": None, "functions": {}}, {}
    keys = {launch.key for spec in specializations(engine) for launch in spec.launches if launch.key}
    return encode(binaries.binaries_for(keys), binaries.current_arch())


def specializations(engine):
    """The specializations whose kernels a plan carries: each profile's at its opt shapes
    (the tuned tactics), at its specialized shapes, and at its probe shapes (the generic
    ones, :func:`plugrt.engine.generic.probes`, whose kernels serve every other shape)."""
    for index, profile in enumerate(engine.profiles):
        with engine.create_execution_context(use_cuda_graph=False, profile=index) as context:
            at_opt = context.current
            special = [Probe(entry["shapes"]) for entry in engine.specialized if entry["profile"] == index]
            for probe in [None] + special + probes(profile, bool(at_opt.graph.data_dependent)):
                spec = at_opt if probe is None else context.specialize(probe.shapes, probe.values or None)
                yield spec
                yield from spec.chain(context, "max" if probe is None else probe.sizes)


def planned_keys(engine) -> set[str]:
    """:func:`plugrt.engine.generic.launch_key` of every launch a plan's kernels cover
    (what a shape's launches must be among to compile nothing, in the simulator too)."""
    return {launch_key(launch.key, launch.launch.kernel) for spec in specializations(engine) for launch in spec.launches}


def encode(kernels: dict[str, KernelBinary], arch: str | None) -> tuple[dict, dict[str, np.ndarray]]:
    """``(section, arrays)`` for ``kernels`` (full key -> binary), identical code once."""
    functions, arrays = {}, {}
    for key in sorted(kernels):
        binary = kernels[key]
        names = []
        for data in (binary.cubin, binary.ptx):
            name = ARRAY_PREFIX + hashlib.sha256(data).hexdigest()
            arrays.setdefault(name, np.frombuffer(data, np.uint8))
            names.append(name)
        functions[key] = {"entry": binary.entry, "cubin": names[0], "ptx": names[1],
                          "check": kernel_record_check(key, binary.entry, *names)}
    return {"arch": arch if functions else None, "functions": functions}, arrays


def decode(section: dict | None, arrays: dict[str, np.ndarray]) -> tuple[dict[str, KernelBinary], str | None]:
    """The binaries a (checked, :mod:`plugrt.engine.plan_schema`) section names, and their
    architecture."""
    if not section or not section["functions"]:
        return {}, None
    arch = section["arch"]
    found = {key: KernelBinary(entry["entry"], arch, arrays[entry["cubin"]].tobytes(), arrays[entry["ptx"]].tobytes())
             for key, entry in section["functions"].items()}
    return found, arch


def supply(section: dict | None, arrays: dict[str, np.ndarray], label: str) -> None:
    """Hand a loaded plan's kernels to the kernel store."""
    found, arch = decode(section, arrays)
    if found:
        binaries.supply(found, arch, label)
