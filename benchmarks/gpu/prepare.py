"""Put the peers' sources a GPU device run needs into ``.cache/peers`` (ignored; carried to the device).

Run here, with PyPI reachable (the device has no network)::

    python -m benchmarks.gpu.prepare            # then carry .cache/peers in the device call

What lands there (nothing of it is committed; ``manifest.json`` records versions, hashes and sizes):

- ``flashinfer/include/flashinfer/``: FlashInfer's header-only ``sampling.cuh`` and every header it
  includes, transitively, from the ``flashinfer-python`` wheel (``pip download --no-deps``). Our wrapper
  ``benchmarks/gpu/flashinfer_chain.cu`` compiles against them.
- ``curand/include/``: cuRAND's headers (``curand_kernel.h`` and the rest, about 2 MiB) from the
  ``nvidia-curand`` wheel, which ``sampling.cuh`` includes: the extension falls back to them where the CUDA
  toolkit lacks them (the toolkit on the development machines does).
- ``vllm-0.33.0/vllm/``: the vLLM 0.33.0 Python files that hold the V2 ``rejection_sample`` and the V1
  rejection sampler's Triton kernels, and the modules they import (:data:`VLLM_FILES`), copied from the
  unpacked wheel (``.cache/vllm-0.33.0``, as ``.ci/run`` extracts it, or ``--vllm-src``).
  :mod:`benchmarks.gpu.peers` loads them without vLLM's package ``__init__`` or its dependencies.

The whole folder stays far under the device's 64 MiB limit on carried paths (checked: exit 1 over
:data:`MAX_BYTES`).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from ..common import REPO_ROOT, OneLineParser, git_commit

PEERS = REPO_ROOT / ".cache" / "peers"
VLLM_VERSION = "0.33.0"
VLLM_SRC = REPO_ROOT / ".cache" / f"vllm-{VLLM_VERSION}"
FLASHINFER_HEADER = "flashinfer/sampling.cuh"
WHEEL_INCLUDE = "flashinfer/data/include/"
MAX_BYTES = 16 << 20
# vLLM modules (paths under vllm/) that the V2 rejection_sample and the V1 rejection sampler import and
# that peers.py loads from files; the rest of what they import is stubbed there (peers.V1_STUBS).
VLLM_FILES = (
    "v1/worker/gpu/spec_decode/rejection_sampler_utils.py",
    "v1/spec_decode/fly.py",
    "v1/worker/gpu/sample/gumbel.py",
    "v1/worker/gpu/sample/watermark.py",
    "v1/watermarking/prfs/philox.py",
    "v1/watermarking/prfs/base.py",
    "v1/sample/rejection_sampler.py",
    "model_executor/warmup/jit_warmup.py",
    "model_executor/warmup/jit_warmup_triton_helper.py",
)
_INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', re.M)


def header_closure(members: dict[str, bytes], root: str, first: str) -> dict[str, bytes]:
    """``first`` and every header it includes, transitively, that exists in ``members`` (paths relative to
    ``root``; an include is looked up beside the including file, then under ``root``)."""
    found: dict[str, bytes] = {}
    todo = [first]
    while todo:
        name = todo.pop()
        if name in found:
            continue
        found[name] = members[root + name]
        here = name.rsplit("/", 1)[0] + "/" if "/" in name else ""
        for inc in _INCLUDE.findall(found[name].decode("utf-8", "replace")):
            for cand in (here + inc, inc):
                if root + cand in members:
                    todo.append(cand)
                    break
    return found


def download(dest: Path, wheel: Path | None, requirement: str) -> Path:
    """A wheel: ``wheel`` when given, else ``pip download --no-deps requirement`` into ``dest``."""
    if wheel is not None:
        return wheel
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "-d",
                    str(dest), requirement], check=True)
    stem = requirement.split("=")[0].split("<")[0].split(">")[0].replace("-", "_")
    return next(dest.glob(f"{stem}-*.whl"))


def wheel_version(z: zipfile.ZipFile) -> str:
    return next((n.split("/")[0].removesuffix(".dist-info").split("-")[1] for n in z.namelist()
                 if n.endswith(".dist-info/METADATA")), "unknown")


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def prepare(out: Path, vllm_src: Path, wheel: Path | None, curand_wheel: Path | None = None) -> dict:
    """Fill ``out`` (replaced) and return the manifest written to ``out/manifest.json``."""
    if not (vllm_src / "vllm" / "__init__.py").exists():
        raise SystemExit(f"vLLM {VLLM_VERSION} sources not found at {vllm_src}: `bash .ci/run --install-only` "
                         f"extracts them (pip download vllm=={VLLM_VERSION} --no-deps), or pass --vllm-src")
    if out.exists():
        shutil.rmtree(out)
    files: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        whl = download(Path(tmp), wheel, "flashinfer-python")
        wheel_sha = _sha256(whl.read_bytes())
        with zipfile.ZipFile(whl) as z:
            members = {n: z.read(n) for n in z.namelist() if n.startswith(WHEEL_INCLUDE)}
            version = wheel_version(z)
        headers = {f"flashinfer/include/{name}": data
                   for name, data in header_closure(members, WHEEL_INCLUDE, FLASHINFER_HEADER).items()}
        cu_whl = download(Path(tmp), curand_wheel, "nvidia-curand")
        with zipfile.ZipFile(cu_whl) as z:
            curand_version = wheel_version(z)
            headers.update({f"curand/include/{n.rsplit('/', 1)[1]}": z.read(n) for n in z.namelist()
                            if "/include/" in n and n.endswith(".h")})
        for name, data in sorted(headers.items()):
            path = out / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
            files[name] = {"bytes": len(data), "sha256": _sha256(data)}
    for rel in VLLM_FILES:
        data = (vllm_src / "vllm" / rel).read_bytes()
        path = out / f"vllm-{VLLM_VERSION}" / "vllm" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        files[str(path.relative_to(out))] = {"bytes": len(data), "sha256": _sha256(data)}
    total = sum(f["bytes"] for f in files.values())
    manifest = {
        "command": "python -m benchmarks.gpu.prepare" + "".join(f" {a}" for a in sys.argv[1:]),
        "git_commit": git_commit(),
        "flashinfer": {"version": version, "wheel": whl.name, "wheel_sha256": wheel_sha},
        "curand": {"version": curand_version, "wheel": cu_whl.name},
        "vllm": {"version": VLLM_VERSION, "source": str(vllm_src)},
        "total_bytes": total,
        "files": files,
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def main(argv: list[str] | None = None) -> int:
    ap = OneLineParser(prog="python -m benchmarks.gpu.prepare", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=PEERS, help=f"output folder (default {PEERS})")
    ap.add_argument("--vllm-src", type=Path, default=VLLM_SRC,
                    help=f"unpacked vLLM {VLLM_VERSION} wheel (default {VLLM_SRC})")
    ap.add_argument("--wheel", type=Path, default=None,
                    help="a flashinfer-python wheel already downloaded (default: pip download it)")
    ap.add_argument("--curand-wheel", type=Path, default=None,
                    help="an nvidia-curand wheel already downloaded (default: pip download it)")
    args = ap.parse_args(argv)
    manifest = prepare(args.out, args.vllm_src, args.wheel, args.curand_wheel)
    total = manifest["total_bytes"]
    print(f"prepare: {len(manifest['files'])} files, {total / 2**20:.2f} MiB in {args.out} "
          f"(flashinfer {manifest['flashinfer']['version']}, vllm {VLLM_VERSION})")
    if total > MAX_BYTES:
        print(f"prepare: over the {MAX_BYTES >> 20} MiB budget for carried peers", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
