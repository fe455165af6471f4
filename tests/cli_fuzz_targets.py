"""The CLI fuzz target, run in a fuzz_harness worker: one case is a ``plugrt`` argument list
whose ``@name`` words stand for files of every kind (a model, a plan, an npz, a folder, a
missing path, a link to the model, ...), made afresh in a temporary folder for each case.

A case fails when the command exits with a status other than 0, 1 or 2, prints a
traceback or more than one error line, changes a file it named as an input or did not
name at all, or replaces a file of another kind without ``--force``.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import shutil
import tempfile

import numpy as np

#: Options whose value a command writes; every other file it names it only reads.
OUTPUT_OPTIONS = ("-o", "--output", "--save", "--timing-cache", "--dest", "--json")
#: The files a case may name (``@name``); "missing", "nodir/x", the NUL and long names and "" are never made.
SLOTS = ("model", "other.onnx", "plan", "in.npz", "x.npy", "t.json", "damaged.json", "notes.txt", "empty",
         "folder", "missing", "nodir/x", "link", "dangling", "folder/", "nul\0x", "L" * 300, "")

#: The file that fits each slot of each command.
_FITS = {"build": ("model", "missing", "missing", ""), "run": ("plan", "in.npz", "missing", "model"),
         "inspect": ("plan", "", "", ""), "check": ("model", "", "", ""), "merge": ("t.json", "t.json", "missing", ""),
         "new-plugin": ("missing", "", "", ""), "bench": ("plan", "missing", "missing", "model")}

_FIXTURES: dict[str, bytes] | None = None


def _fixtures() -> dict[str, bytes]:
    """The bytes of each regular fixture, made once per worker."""
    global _FIXTURES
    if _FIXTURES is None:
        from plugrt.engine import Builder
        from plugrt.testing import single_node_model
        from plugrt.tuning import TimingCache

        x = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)
        model = single_node_model("Relu", {"x": x}).SerializeToString()
        npz, npy = io.BytesIO(), io.BytesIO()
        np.savez(npz, x=x)
        np.save(npy, x)
        cache = json.dumps(TimingCache({"L": {"t": 1.0}}).as_json()).encode()
        plan_dir = tempfile.mkdtemp()
        Builder().build_engine(model).save(os.path.join(plan_dir, "m.plan"))
        with open(os.path.join(plan_dir, "m.plan"), "rb") as f:
            plan = f.read()
        shutil.rmtree(plan_dir)
        _FIXTURES = {"model": model, "other.onnx": single_node_model("Relu", {"other": x}).SerializeToString(),
                     "plan": plan, "in.npz": npz.getvalue(), "x.npy": npy.getvalue(), "t.json": cache,
                     "damaged.json": cache[: len(cache) // 2], "notes.txt": b"my notes\n", "empty": b""}
    return _FIXTURES


def _make_folder(folder: str) -> None:
    for name, data in _fixtures().items():
        with open(os.path.join(folder, name), "wb") as f:
            f.write(data)
    os.mkdir(os.path.join(folder, "folder"))
    os.symlink("model", os.path.join(folder, "link"))
    os.symlink("gone", os.path.join(folder, "dangling"))


def _state(folder: str) -> dict[str, bytes | None]:
    state = {}
    for name in os.listdir(folder):
        path = os.path.join(folder, name)
        state[name] = open(path, "rb").read() if os.path.isfile(path) else None
    return state


def _kind(data: bytes | None) -> str:
    from plugrt.paths import file_kind

    if data is None:
        return "none"
    with tempfile.NamedTemporaryFile() as f:
        f.write(data)
        f.flush()
        return file_kind(f.name)


def run_cli(payload: bytes):
    """Run one case (a JSON argument list); return a problem, or ``None``."""
    from plugrt.cli import main

    argv = json.loads(payload.decode())
    folder = tempfile.mkdtemp(prefix="plugrt-cli-fuzz-")
    here = os.getcwd()
    try:
        _make_folder(folder)
        os.chdir(folder)
        args = [word[1:] if word.startswith("@") else word for word in argv]
        before = _state(folder)
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(args)
            except SystemExit as exc:  # argparse: usage errors are status 2
                code = exc.code if isinstance(exc.code, int) else 2
        return _judge(args, code, err.getvalue(), before, _state(folder))
    finally:
        os.chdir(here)
        shutil.rmtree(folder, ignore_errors=True)


def _judge(args: list[str], code, err: str, before: dict, after: dict) -> str | None:
    if code not in (0, 1, 2):
        return f"{args}: exit status {code}"
    if "Traceback" in err:
        return f"{args}: traceback on stderr: {err[-800:]}"
    if sum(line.startswith("plugrt: error:") for line in err.splitlines()) > 1:
        return f"{args}: more than one error line: {err[-800:]}"
    outputs = {args[i + 1] for i, word in enumerate(args[:-1]) if word in OUTPUT_OPTIONS}
    inputs = _inputs(args, outputs)
    for name, old in before.items():
        new = after.get(name)
        if new == old or (old is None and name == "dangling"):
            continue  # a dangling link is replaced by the file, and nothing is lost
        if name not in outputs:
            return f"{args}: {name!r}, not an output, changed"
        if _identity(name) in inputs:
            return f"{args}: the input {name!r} changed"
        if "--force" not in args and _kind(old) not in (_kind(new), "an empty file"):
            return f"{args}: {name!r} ({_kind(old)}) was replaced by {_kind(new)} without --force"
    return None


def _identity(name: str) -> str:
    return "model" if name == "link" else name


def _inputs(args: list[str], outputs: set[str]) -> set[str]:
    """The files the command reads: every word that is not an output option's value."""
    found = {_identity(word) for i, word in enumerate(args) if not (i and args[i - 1] in OUTPUT_OPTIONS)}
    if args[:2] == ["timing-cache", "merge"]:
        found -= outputs  # merging into one of the caches loses nothing
    return found


# ---------------------------------------------------------------------------- cases


def cases(count: int, seed: int = 14) -> list[bytes]:
    """``count`` argument lists, the same ones for a seed."""
    rng = random.Random(seed)
    made = []
    for _ in range(count):
        command = rng.choice(("build", "build", "run", "run", "inspect", "check", "merge", "new-plugin", "bench"))
        # Half the slots hold the file that fits there, so that some commands get to the work.
        fits = _FITS[command]
        slot = ["@" + (fits[i] if rng.random() < 0.5 else rng.choice(SLOTS)) for i in range(4)]
        force = ["--force"] if rng.random() < 0.3 else []
        if command == "build":
            argv = ["build", slot[0], "-o", slot[1], "--no-progress", *force]
            if rng.random() < 0.3:
                argv += ["--timing-cache", slot[2]]
        elif command == "run":
            argv = ["run", slot[0]]
            for option, value in (("--inputs", slot[1]), ("--save", slot[2]), ("--compare-onnxruntime", slot[3])):
                if rng.random() < 0.5:
                    argv += [option, value]
            argv += force
        elif command == "bench":
            argv = ["bench", slot[0] if rng.random() < 0.7 else slot[3], "--iterations", "1", "--warmup", "0",
                    "--duration", "0", "--no-progress", *force]
            if rng.random() < 0.6:
                argv += ["--json", slot[1]]
            if rng.random() < 0.3:
                argv += ["--timing-cache", slot[2]]
        elif command in ("inspect", "check"):
            argv = [command, slot[0]]
        elif command == "merge":
            argv = ["timing-cache", "merge", *slot[: rng.randint(1, 2)], "-o", slot[2], *force]
        else:
            argv = ["new-plugin", "fz", "--op", "Fz", "--dest", slot[0]]
        made.append(json.dumps(argv).encode())
    return made
