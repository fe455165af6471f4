"""``plugrt new-plugin``: render the plugin template into a new, installable, tested package.

Few questions, derived names (datasette-plugin's template is the model): ``NAME`` gives the
distribution ``plugrt-NAME``, the import name ``plugrt_NAME`` and the entry point; ``--op``
the ONNX op type (also the class name); ``--domain`` the ONNX domain (default
``com.NAME``); ``--kind`` a pointwise op (a scalar device function the core fuses, plus a
hand-written kernel), a custom one (explicit ``@cuda.jit`` kernels using a workspace), or
a tactic plugin: no op, more tactics for an installed one-input pointwise op that another
plugin owns (``--domain`` then defaults to the default ONNX domain).

The template is the folder ``plugin_template/`` (installed as the package
``plugrt.plugin_template``). Its ``files/`` tree is rendered with Jinja2, strictly (an
unknown variable is an error): ``*.j2`` files lose the suffix, and path parts are templates
too; a file that renders to nothing (a kind that has no use for it) is not written.
Rendering goes to a temporary folder beside the destination, which is moved into place
only when every file rendered, so a failure leaves nothing half-written.
"""

from __future__ import annotations

import dataclasses
import keyword
import os
import re
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from plugrt.errors import PlugrtError
from plugrt.files import current_umask
from plugrt.plugin import POINTWISE

KINDS = ("pointwise", "custom", "tactic")
TACTIC = "tactic"
TEMPLATE_SUFFIX = ".j2"

_NAME = re.compile(r"[A-Za-z][A-Za-z0-9]*(?:[-_][A-Za-z0-9]+)*")
_OP_TYPE = re.compile(r"[A-Za-z][A-Za-z0-9_]*")
_DOMAIN = re.compile(r"[A-Za-z][A-Za-z0-9_]*(?:\.[A-Za-z0-9_]+)*")
#: Names the rendered modules import or define: an op type equal to one would shadow it.
_RESERVED_OP_TYPES = frozenset({
    "Attr", "Example", "FLOAT_DTYPES", "Launch", "OpPlugin", "POINTWISE", "PLUGRT_API", "Tactic", "TensorInfo",
})


@dataclass(frozen=True)
class PluginSpec:
    """The names a rendered plugin package uses, all derived from the few answers."""

    name: str
    distribution: str
    module: str
    op_type: str
    op_snake: str
    domain: str
    domain_given: bool
    kind: str
    #: The opset of the op's domain the rendered tests' models import (``None``: 1 for a
    #: domain of the plugin's own, 17 for the default one).
    opset: int | None = None

    @property
    def domain_label(self) -> str:
        return self.domain or "ai.onnx"

    @property
    def qualified_op(self) -> str:
        return f"{self.domain}::{self.op_type}" if self.domain else self.op_type

    def context(self) -> dict:
        """The variables the templates see."""
        from plugrt import API_VERSION, __version__

        return dict(asdict(self), domain_label=self.domain_label, qualified_op=self.qualified_op,
                    plugrt_version=__version__, api_version=API_VERSION,
                    model_opset=self.opset if self.opset is not None else 1 if self.domain else 17)


def plugin_spec(name: str, op_type: str, domain: str | None = None, kind: str = "pointwise") -> PluginSpec:
    """Validate the answers and derive every name.

    :raises PlugrtError: naming the answer at fault and what a valid one looks like.
    """
    if not _NAME.fullmatch(name or ""):
        raise PlugrtError(f"plugin name {name!r} is not valid: use letters, digits and single '-' or '_' "
                          "between them, starting with a letter (e.g. 'soft-clip')")
    short = re.sub(r"^plugrt[-_]", "", name.lower())
    if short == "plugrt":
        raise PlugrtError("plugin name 'plugrt' is the core's own distribution: choose another name")
    if not _OP_TYPE.fullmatch(op_type or "") or keyword.iskeyword(op_type):
        raise PlugrtError(f"--op {op_type!r} is not a valid op type: use an identifier starting with a letter, "
                          "in the ONNX style (e.g. 'SoftClip')")
    if op_type in _RESERVED_OP_TYPES:
        raise PlugrtError(f"--op {op_type!r} would shadow a name the plugin module imports; choose another op type")
    given = domain is not None
    if domain is None:
        domain = "" if kind == TACTIC else "com." + short.replace("-", "_")
    elif domain == "ai.onnx":
        domain = ""
    if domain and not _DOMAIN.fullmatch(domain):
        raise PlugrtError(f"--domain {domain!r} is not a valid ONNX domain: use dot-separated identifiers "
                          "(e.g. 'com.example'), or '' / 'ai.onnx' for the default ONNX domain")
    from plugrt.fusion.op import FUSED_DOMAIN

    if domain == FUSED_DOMAIN or domain.startswith(FUSED_DOMAIN + "."):
        raise PlugrtError(f"--domain {domain!r} is plugrt's own (its fused layers): choose another domain")
    if kind not in KINDS:
        raise PlugrtError(f"--kind {kind!r} is not one of {', '.join(KINDS)}")
    return PluginSpec(name=name, distribution="plugrt-" + short.replace("_", "-"),
                      module="plugrt_" + short.replace("-", "_"), op_type=op_type, op_snake=_snake(op_type),
                      domain=domain, domain_given=given, kind=kind)


def _snake(op_type: str) -> str:
    """``SoftClip`` -> ``soft_clip``; ``GELUTanh`` -> ``gelu_tanh``."""
    text = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", op_type)
    text = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", text)
    return re.sub(r"_+", "_", text).lower()


def check_registry(spec: PluginSpec, registry) -> PluginSpec:
    """The spec checked against the installed plugins: a new op must be nobody's yet; a
    tactic plugin's op must be installed, one-input, pointwise (the placeholder kernel wraps
    its owner's scalar function) and take float32. Returns the spec with the opset its
    tests import."""
    if spec.kind != TACTIC:
        check_not_provided(spec, registry)
        return spec
    ops = [op for op in registry.ops() if op.op_type == spec.op_type and op.domain == spec.domain]
    if not ops:
        raise PlugrtError(f"--kind tactic: no installed plugin provides op {spec.qualified_op}; a tactic plugin adds "
                          "tactics to an op another plugin owns (plugrt plugins lists them)")
    op = max(ops, key=lambda o: o.since_opset)
    owner = registry.owner(op)
    if POINTWISE not in op.groups or op.inputs[0] != 1 or np.dtype(np.float32) not in op.dtypes:
        raise PlugrtError(f"--kind tactic: op {spec.qualified_op} (plugin {owner.name!r}) is not a one-input pointwise "
                          "op on float32, which the template's placeholder kernel needs; pick such an op (plugrt "
                          "plugins lists the ops) and write the kernel for yours from there")
    opset = op.since_opset if spec.domain else max(17, op.since_opset)
    if op.until_opset is not None:
        opset = min(opset, op.until_opset)
    return dataclasses.replace(spec, opset=opset)


def check_not_provided(spec: PluginSpec, registry) -> None:
    """Refuse an op an installed plugin already provides: the new one could not register."""
    op = registry.find_op(spec.domain, spec.op_type, 1 if spec.domain else 17)
    if op is None:
        return
    owner = registry.owner(op)
    raise PlugrtError(f"op {spec.qualified_op} is already provided by plugin {owner.name!r} "
                      f"({owner.distribution or 'no distribution'}); choose another --op, or a --domain of your own")


def template_root() -> Path:
    """The template's ``files/`` tree: from the installed package, or the source checkout."""
    from importlib import resources

    try:
        root = Path(str(resources.files("plugrt.plugin_template"))) / "files"
    except ModuleNotFoundError:
        root = Path(__file__).resolve().parents[1] / "plugin_template" / "files"
    if not root.is_dir():
        raise PlugrtError(f"the plugin template is missing ({root}); reinstall plugrt")
    return root


def default_dest(spec: PluginSpec) -> Path:
    return Path.cwd() / spec.distribution


def render_plugin(spec: PluginSpec, dest: str | os.PathLike | None = None) -> list[Path]:
    """Render the template for ``spec`` into the new folder ``dest`` (default ``./DISTRIBUTION``).

    :returns: the written files, relative to ``dest``, sorted.
    :raises PlugrtError: when ``dest`` exists and is not an empty folder, or its parent
        folder does not exist.
    """
    dest = Path(dest) if dest is not None else default_dest(spec)
    _check_dest(dest)
    import jinja2

    root = template_root()
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(root)), undefined=jinja2.StrictUndefined,
                             keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True, autoescape=False)
    context = spec.context()
    staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=dest.parent))
    os.chmod(staging, 0o777 & ~current_umask())  # mkdtemp's 0o700 would outlive the rename
    written = []
    try:
        for source in sorted(p for p in root.rglob("*") if p.is_file() and p.name.endswith(TEMPLATE_SUFFIX)):
            relative = source.relative_to(root).as_posix()
            try:
                target = env.from_string(relative[: -len(TEMPLATE_SUFFIX)]).render(context)
                text = env.get_template(relative).render(context)
            except jinja2.TemplateError as exc:
                raise PlugrtError(f"the plugin template's {relative} does not render ({type(exc).__name__}: "
                                  f"{exc}); reinstall plugrt") from None
            if not text.strip():
                continue  # this kind has no use for the file
            path = staging / target
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            written.append(Path(target))
        if dest.exists():
            dest.rmdir()  # empty, checked above
        os.replace(staging, dest)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return sorted(written)


def _check_dest(dest: Path) -> None:
    if dest.exists():
        if not dest.is_dir():
            raise PlugrtError(f"--dest {str(dest)!r} is a file; name a new folder")
        if any(dest.iterdir()):
            raise PlugrtError(f"--dest {str(dest)!r} exists and is not empty; name a new or empty folder")
    if not dest.parent.is_dir():
        raise PlugrtError(f"--dest {str(dest)!r}: its parent folder {str(dest.parent)!r} does not exist; "
                          "create it first")
