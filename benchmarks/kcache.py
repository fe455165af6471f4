"""Carry the benchmarks' kernel cache between GPU calls (``gpu_run.sh``): ``pack DIR OUT``
writes DIR as an xz tar in 15 MB parts ``OUT/kcache.tar.xz.part-NN`` (what a call's $OUT
can hand back); ``unpack PARTS DIR`` joins and extracts them into DIR. The cache's files are
plugrt's own kernel files (:mod:`plugrt.kernel_cache`), checked again when read."""

from __future__ import annotations

import glob
import io
import os
import sys
import tarfile

PART = 15 * 1024 * 1024


def pack(folder: str, out: str) -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:xz", preset=1) as tar:
        for name in sorted(os.listdir(folder)):
            tar.add(os.path.join(folder, name), arcname=name)
    data = buffer.getvalue()
    os.makedirs(out, exist_ok=True)
    for index in range(0, len(data), PART):
        with open(os.path.join(out, f"kcache.tar.xz.part-{index // PART:02d}"), "wb") as f:
            f.write(data[index:index + PART])
    print(f"kernel cache: {len(os.listdir(folder))} kernels, {len(data) / 1e6:.1f} MB packed in {out}")


def unpack(parts: str, folder: str) -> None:
    files = sorted(glob.glob(os.path.join(parts, "kcache.tar.xz.part-*")))
    if not files:
        return
    data = b"".join(open(f, "rb").read() for f in files)
    os.makedirs(folder, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:xz") as tar:
        members = [m for m in tar.getmembers() if m.isfile() and "/" not in m.name and not m.name.startswith(".")]
        tar.extractall(folder, members=members, filter="data")
    print(f"kernel cache: {len(members)} kernels carried in")


if __name__ == "__main__":
    {"pack": pack, "unpack": unpack}[sys.argv[1]](sys.argv[2], sys.argv[3])
