"""Files moved between this machine and the GPU machine in parts (a call carries at most
64 MiB and hands back files of at most 16 MB): ``split SRC PARTS N [xz]`` packs folder SRC
as one tar (xz-compressed with ``xz``) cut into parts of at most N MB, each in its own
folder ``PARTS1``, ``PARTS2``, ... with a manifest; ``join PARTS DEST`` checks that every
part is present and whole (sha256) and unpacks them into DEST, else says what is missing
and exits 1. Two uses (``gpu_run.sh``):

- wheels too large for one call (Ray Serve, nvidia-pytriton and their dependencies): call k
  carries ``.carryk``; each part that arrives whole is kept in a stash outside the work tree
  (``~/.cache/plugrt-carry``, or ``$PLUGRT_CARRY_STASH``: a part carried by an earlier call
  was gone from the tree of the next one on the same warm machine), and the call that
  completes the set installs them;
- the benchmarks' kernel cache, handed back as ``$OUT/kcache1..`` and carried into the next
  call as ``.kcache1..``, so its builds compile nothing they compiled before.

    python3 benchmarks/carry.py split /tmp/wheels .carry 45   # here: .carry1 .. .carryK
    python3 benchmarks/carry.py join .carry .carried          # there, in the last call
"""

from __future__ import annotations

import glob
import hashlib
import io
import json
import os
import sys
import tarfile


def split(source: str, parts: str, megabytes: str, compression: str = "") -> int:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:xz", preset=1) if compression == "xz" else \
            tarfile.open(fileobj=buffer, mode="w") as tar:
        for name in sorted(os.listdir(source)):
            tar.add(os.path.join(source, name), arcname=name)
    data, size = buffer.getvalue(), int(float(megabytes) * 1e6)
    chunks = [data[i:i + size] for i in range(0, len(data), size)]
    manifest = {"parts": len(chunks), "sha256": [hashlib.sha256(c).hexdigest() for c in chunks]}
    for index, chunk in enumerate(chunks, 1):
        folder = f"{parts}{index}"
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, f"part-{index:02d}"), "wb") as f:
            f.write(chunk)
        with open(os.path.join(folder, "manifest.json"), "w") as f:
            json.dump(manifest, f)
    print(f"{len(os.listdir(source))} files, {len(data) / 1e6:.1f} MB in {len(chunks)} parts: "
          + " ".join(f"{parts}{i}" for i in range(1, len(chunks) + 1)))
    return 0


def join(parts: str, dest: str, optional: str = "") -> int:
    """(``optional``: no parts at all is no error.)"""
    manifests = sorted(glob.glob(f"{parts}*/manifest.json"))
    if not manifests:
        print(f"carry: no {parts}*/manifest.json here")
        return 0 if optional else 1
    manifest = json.load(open(manifests[0]))
    # Parts carried by earlier calls to the same machine wait in a stash outside the work
    # tree (a call's copy of the tree keeps no part it did not carry itself).
    stash = os.path.join(os.environ.get("PLUGRT_CARRY_STASH", os.path.expanduser("~/.cache/plugrt-carry")),
                         os.path.basename(parts.rstrip("/")) or "parts")
    wanted = manifest["sha256"]
    for index in range(1, manifest["parts"] + 1):  # first keep every whole part carried here
        path, kept = os.path.join(f"{parts}{index}", f"part-{index:02d}"), os.path.join(stash, wanted[index - 1])
        if os.path.exists(path) and not os.path.exists(kept):
            chunk = open(path, "rb").read()
            if hashlib.sha256(chunk).hexdigest() == wanted[index - 1]:
                try:
                    os.makedirs(stash, exist_ok=True)
                    with open(kept + ".tmp", "wb") as out:
                        out.write(chunk)
                    os.replace(kept + ".tmp", kept)
                except OSError:
                    pass
    chunks = []
    for index in range(1, manifest["parts"] + 1):
        path, kept = os.path.join(f"{parts}{index}", f"part-{index:02d}"), os.path.join(stash, wanted[index - 1])
        found = path if os.path.exists(path) else kept if os.path.exists(kept) else None
        chunk = open(found, "rb").read() if found else None
        if chunk is None or hashlib.sha256(chunk).hexdigest() != wanted[index - 1]:
            print(f"carry: part {index} of {manifest['parts']} is {'missing' if chunk is None else 'damaged'} "
                  f"({path}); carry {parts}{index} in a call")
            return 1
        chunks.append(chunk)
    os.makedirs(dest, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(b"".join(chunks)), mode="r:*") as tar:
        tar.extractall(dest, filter="data")
    print(f"carry: {manifest['parts']} parts joined into {dest}: {len(os.listdir(dest))} files")
    return 0


if __name__ == "__main__":
    sys.exit({"split": split, "join": join}[sys.argv[1]](*sys.argv[2:]))
