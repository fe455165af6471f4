"""Files too large for one GPU call's carry (64 MiB), sent over several calls on a warm
machine: ``split SRC PARTS N`` packs folder SRC (e.g. wheels: Ray, nvidia-pytriton and
their dependencies) as one tar cut into parts of at most N MB, each in its own folder
``PARTS1``, ``PARTS2``, ... with a manifest; call k carries ``PARTSk`` (the folders carried
earlier stay on the warm machine: ignored paths not named again are kept). There, ``join
PARTS DEST`` checks that every part is present and whole (sha256) and unpacks them into
DEST; it says what is missing otherwise and exits 1.

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


def split(source: str, parts: str, megabytes: str) -> int:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
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


def join(parts: str, dest: str) -> int:
    manifests = sorted(glob.glob(f"{parts}*/manifest.json"))
    if not manifests:
        print(f"carry: no {parts}*/manifest.json here")
        return 1
    manifest = json.load(open(manifests[0]))
    chunks = []
    for index in range(1, manifest["parts"] + 1):
        path = os.path.join(f"{parts}{index}", f"part-{index:02d}")
        chunk = open(path, "rb").read() if os.path.exists(path) else None
        if chunk is None or hashlib.sha256(chunk).hexdigest() != manifest["sha256"][index - 1]:
            print(f"carry: part {index} of {manifest['parts']} is {'missing' if chunk is None else 'damaged'} "
                  f"({path}); carry {parts}{index} in a call")
            return 1
        chunks.append(chunk)
    os.makedirs(dest, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(b"".join(chunks)), mode="r") as tar:
        tar.extractall(dest, filter="data")
    print(f"carry: {manifest['parts']} parts joined into {dest}: {len(os.listdir(dest))} files")
    return 0


if __name__ == "__main__":
    sys.exit({"split": split, "join": join}[sys.argv[1]](*sys.argv[2:]))
