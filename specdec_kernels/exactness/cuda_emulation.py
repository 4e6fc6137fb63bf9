"""The project's CUDA kernels, run on the CPU through a host emulation (for the tests and the audit's
``cuda-emulated`` target; not a backend).

``verify_chain`` and ``verify_tree`` take the public API's arguments and run its checks
(:func:`specdec_kernels.api.checked_chain_args`), then do what the torch binding
``csrc/cuda/ops_cuda.cpp`` does — allocate outputs and workspace, fill the argument structs, call the
launchers — on CPU tensors. The launchers and kernels are the very sources of ``csrc/cuda/`` and
``csrc/include/specdec/cuda/*.cuh``, compiled by the host compiler on the fiber emulation of
``csrc/cuda_emulation/`` (built with the native extension as ``specdec_kernels/exactness/_cuda_emulation.so``):
every block runs as ``blockDim`` cooperative fibers with real ``__syncthreads`` barriers, warp
shuffles and votes exchanged among the lanes of a warp, per-block ``__shared__`` storage and atomics,
under the launch configurations of the typed table for the chosen device.

``schedule`` picks the interleaving: ``"forward"`` / ``"reverse"`` run every ready thread once to its next
synchronisation point, in ascending / descending order, before any runs again (blocks in grid / reverse
grid order); ``"eager"`` resumes the threads a synchronisation released first, so that a warp runs ahead
through its shuffles while the others wait; ``"random"`` runs a random ready thread at every step and the
blocks in a random order (seeded by ``schedule_seed``). Shared memory, dynamic
shared memory and the workspace are poisoned before use, and the outputs are fenced by canaries, so a
missing barrier, a shared-memory race, a read of uninitialised memory or a write out of bounds changes
the tokens under some schedule or raises :class:`EmulationError`. ``drop_barrier="file:line"`` skips one
``__syncthreads`` (a planted bug for tests that prove the schedules catch it).

What it cannot show: the GPU's memory model (the emulation is sequentially consistent; fences and
``volatile`` are not exercised), concurrency between blocks (blocks run one after another), and
anything about speed.
"""

from __future__ import annotations

import ctypes
import importlib.machinery
import threading
from dataclasses import dataclass
from pathlib import Path

import torch

from .. import api
from ..reference.chain import ChainResult
from ..reference.tree import TreeResult

__all__ = [
    "ARCHS",
    "SCHEDULES",
    "ConfigEntry",
    "EmulationError",
    "Launch",
    "available",
    "config_table",
    "last_barrier_sites",
    "last_launches",
    "plan_chain",
    "plan_tree",
    "run_selftest",
    "verify_chain",
    "verify_tree",
]

ARCHS = {"h200": 90, "b200": 100}
"""Emulated devices: compute capability x 10 passed to the launchers (the typed table's key)."""
SCHEDULES = ("forward", "reverse", "eager", "random")
"""Thread interleavings (csrc/cuda_emulation/emu.h): rounds in ascending / descending order, released threads
first (a warp runs ahead of the others up to the next block barrier), random steps."""

_LIB_DIR = Path(__file__).parent
_DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}  # specdec::DType
_CANARY = 64  # int32 elements (256 bytes) fenced before and after every output buffer
_CANARY_VALUE = 0x5A5A5A5A
_LOCK = threading.Lock()
_lib: ctypes.CDLL | None = None
_lib_error: str | None = None


class EmulationError(RuntimeError):
    """A launch the GPU would reject, a synchronisation error, or an out-of-bounds write of a kernel."""


@dataclass(frozen=True)
class Launch:
    """One emulated kernel launch: kernel (as written in the launcher), grid, block, dynamic smem bytes."""

    kernel: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    dynamic_smem: int

    @property
    def threads(self) -> int:
        return self.block[0] * self.block[1] * self.block[2]


@dataclass(frozen=True)
class ConfigEntry:
    """One row of the launch-config table of ``csrc/include/specdec/cuda/cuda_api.h``."""

    min_arch: int
    min_vocab: int
    elem_bytes: int
    threads: int
    slice: int


def _load() -> ctypes.CDLL | None:
    global _lib, _lib_error
    if _lib is None and _lib_error is None:
        paths = [_LIB_DIR / f"_cuda_emulation{suffix}" for suffix in importlib.machinery.EXTENSION_SUFFIXES]
        path = next((p for p in paths if p.exists()), None)
        if path is None:
            _lib_error = "_cuda_emulation not built; rebuild the native extension (setup.py build_ext --inplace)"
            return None
        try:
            lib = ctypes.CDLL(str(path))
        except OSError as exc:
            _lib_error = f"{path.name} does not load ({exc})"
            return None
        p, i32, i64, u64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_uint64
        lib.specdec_emu_configure.argtypes = [i32, u64, ctypes.c_char_p, i32, i32, i32, u64]
        lib.specdec_emu_error.restype = ctypes.c_char_p
        lib.specdec_emu_barrier_sites.restype = ctypes.c_char_p
        lib.specdec_emu_launch_count.restype = i64
        lib.specdec_emu_launch.argtypes = [i64, p, p, p]
        lib.specdec_emu_launch.restype = ctypes.c_char_p
        lib.specdec_emu_config_entry.argtypes = [i32, p, p, p, p, p]
        lib.specdec_emu_chain_workspace_bytes.argtypes = [i32, i64, i32, i64]
        lib.specdec_emu_chain_workspace_bytes.restype = u64
        lib.specdec_emu_tree_workspace_bytes.argtypes = [i64, i64, i32]
        lib.specdec_emu_tree_workspace_bytes.restype = u64
        lib.specdec_emu_chain_block_workspace_bytes.argtypes = [i64, i64]
        lib.specdec_emu_chain_block_workspace_bytes.restype = u64
        lib.specdec_emu_tree_traversal_workspace_bytes.argtypes = [i64, i64, i64, i32]
        lib.specdec_emu_tree_traversal_workspace_bytes.restype = u64
        lib.specdec_emu_verify_chain.argtypes = [p, i32, i64, i64, p, p, i64, p, i32, p, p, p, p, p, i64, p, p, p, p,
                                                 i32, i32]
        lib.specdec_emu_verify_tree.argtypes = [p, i32, i64, i64, p, p, p, i64, p, i32, p, p, p, p, p, i32, i64, p, p,
                                                p, p, p, i32, i32]
        lib.specdec_emu_plan_chain.argtypes = [i32, i64, i32, i64, i64, i32, i32, i32]
        lib.specdec_emu_plan_tree.argtypes = [i32, i64, i32, i64, i32]
        lib.specdec_emu_selftest.argtypes = [ctypes.c_char_p, ctypes.c_uint32, ctypes.c_uint32, ctypes.c_uint32, u64,
                                             i32, p]
        _lib = lib
    return _lib


def available() -> bool:
    """True when the emulation library was built (it is built with the native extension)."""
    return _load() is not None


def _library() -> ctypes.CDLL:
    lib = _load()
    if lib is None:
        raise RuntimeError(f"the CUDA host emulation is unavailable: {_lib_error}")
    return lib


def config_table() -> list[ConfigEntry]:
    """Every entry of the typed launch-config table, as compiled into the kernels' launchers."""
    lib = _library()
    vals = [ctypes.c_int(), ctypes.c_int64(), ctypes.c_int(), ctypes.c_int(), ctypes.c_int64()]
    n = lib.specdec_emu_config_entry(-1, *(ctypes.byref(v) for v in vals))
    out = []
    for i in range(n):
        lib.specdec_emu_config_entry(i, *(ctypes.byref(v) for v in vals))
        out.append(ConfigEntry(*(int(v.value) for v in vals)))
    return out


_last_launches: list[Launch] = []
_last_sites: list[str] = []


def last_launches() -> list[Launch]:
    """The kernel launches of the last emulated ``verify_chain`` / ``verify_tree`` call, in issue order."""
    return list(_last_launches)


def last_barrier_sites() -> list[str]:
    """``"file:line"`` of every ``__syncthreads`` the last call reached (e.g. to plant one missing)."""
    return list(_last_sites)


# ----------------------------------------------------------------------------------------------------
# Buffers: what the binding allocates on the device, here with poison and canaries.
# ----------------------------------------------------------------------------------------------------

def _fenced_int32(shape: tuple[int, ...], fill: int) -> tuple[torch.Tensor, torch.Tensor]:
    n = 1
    for s in shape:
        n *= s
    buf = torch.full((n + 2 * _CANARY,), _CANARY_VALUE, dtype=torch.int32)
    buf[_CANARY:_CANARY + n] = fill
    return buf, buf[_CANARY:_CANARY + n].view(shape)


def _fenced_threshold(row_threshold: torch.Tensor | None, num_rows: int) -> torch.Tensor | None:
    """The ``row_threshold`` output as the kernels see it: a float32 copy of it between two canaries, or None
    (the kernels write nothing); :func:`_return_threshold` checks the canaries and copies it back."""
    if row_threshold is None:
        return None
    if (row_threshold.dtype != torch.float32 or row_threshold.dim() != 1 or row_threshold.numel() != num_rows
            or row_threshold.device.type != "cpu"):
        raise ValueError(f"row_threshold must be a float32 [{num_rows}] CPU tensor, got {row_threshold.dtype} "
                         f"{tuple(row_threshold.shape)} on {row_threshold.device}")
    buf = torch.full((num_rows + 2 * _CANARY,), float(_CANARY_VALUE), dtype=torch.float32)
    buf[_CANARY:_CANARY + num_rows] = row_threshold
    return buf


def _return_threshold(buf: torch.Tensor | None, row_threshold: torch.Tensor | None) -> None:
    if buf is not None:
        _check_fence(buf, _CANARY, float(_CANARY_VALUE), "row_threshold")
        row_threshold.copy_(buf[_CANARY:buf.numel() - _CANARY])


def _threshold_ptr(buf: torch.Tensor | None) -> int | None:
    return None if buf is None else buf.data_ptr() + 4 * _CANARY


def _fenced_bytes(nbytes: int, gen: torch.Generator) -> torch.Tensor:
    """Workspace of ``nbytes`` random bytes (uninitialised device memory) between two canaries."""
    buf = torch.full((nbytes + 8 * _CANARY,), 0x5A, dtype=torch.uint8)
    buf[4 * _CANARY:4 * _CANARY + nbytes] = torch.randint(0, 256, (nbytes,), generator=gen, dtype=torch.uint8)
    return buf


def _check_fence(buf: torch.Tensor, pad: int, value: int, name: str) -> None:
    if not (bool((buf[:pad] == value).all()) and bool((buf[buf.numel() - pad:] == value).all())):
        raise EmulationError(f"a kernel wrote outside {name}")


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def _options(arch: int, schedule: str, schedule_seed: int, drop_barrier: str | None, dry_run: bool = False,
             max_rounds: int = 0) -> tuple:
    """Arguments of specdec_emu_configure."""
    if arch not in ARCHS.values():
        raise ValueError(f"arch must be one of {sorted(ARCHS.values())} ({ARCHS}), got {arch!r}")
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    file, line = b"", 0
    if drop_barrier is not None:
        name, _, num = drop_barrier.rpartition(":")
        if not name or not num.isdigit():
            raise ValueError(f"drop_barrier must be 'file:line', got {drop_barrier!r}")
        file, line = name.encode(), int(num)
    return SCHEDULES.index(schedule), int(schedule_seed) & (2**64 - 1), file, line, arch, int(dry_run), max_rounds


def _check_device(tensors: dict[str, torch.Tensor | None]) -> None:
    for name, t in tensors.items():
        if t is not None and t.device.type != "cpu":
            raise ValueError(f"{name} must be a CPU tensor for the CUDA host emulation, got {t.device}")


def _run(lib: ctypes.CDLL, options: tuple, launch) -> None:
    global _last_launches, _last_sites
    with _LOCK:
        lib.specdec_emu_configure(*options)
        failed = launch() != 0
        grid, block, smem = (ctypes.c_uint32 * 3)(), (ctypes.c_uint32 * 3)(), ctypes.c_uint64()
        _last_launches = [
            Launch(lib.specdec_emu_launch(i, grid, block, ctypes.byref(smem)).decode(), tuple(grid), tuple(block),
                   int(smem.value))
            for i in range(lib.specdec_emu_launch_count())
        ]
        _last_sites = [s for s in lib.specdec_emu_barrier_sites().decode().split("\n") if s]
        message = lib.specdec_emu_error()
    if failed:
        raise EmulationError((message or b"emulated launch failed").decode())


# ----------------------------------------------------------------------------------------------------
# Entry points
# ----------------------------------------------------------------------------------------------------

def verify_chain(
    target_logits: torch.Tensor,
    draft_token_ids: torch.Tensor,
    cu_num_draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None = None,
    temperature: torch.Tensor | None = None,
    top_k: torch.Tensor | None = None,
    top_p: torch.Tensor | None = None,
    seed: torch.Tensor | None = None,
    position: torch.Tensor | None = None,
    *,
    method: str = "token",
    max_draft_len: int | None = None,
    validate: bool = True,
    arch: int = ARCHS["h200"],
    schedule: str = "forward",
    schedule_seed: int = 0,
    drop_barrier: str | None = None,
    row_threshold: torch.Tensor | None = None,
) -> ChainResult:
    """``specdec_kernels.verify_chain`` on CPU tensors through the emulated CUDA kernels of ``arch``;
    ``method="block"`` with draft probabilities runs the block-verification kernel (block.cuh), as the
    binding does (deterministic drafts run the token-level pipeline). ``row_threshold`` [T + B] float32 or
    None: the op's optional output, each decided row's sampling-mask threshold (written in place)."""
    block = api._check_method(method, "chain") == "chain_block"
    args = api.checked_chain_args(
        target_logits, draft_token_ids, cu_num_draft_tokens, draft_probs, temperature, top_k, top_p, seed, position,
        max_draft_len=max_draft_len, validate=validate,
    )
    logits, drafts, cu, probs, temp, tk, tp, sd, pos, width = args
    _check_device({"target_logits": logits})
    options = _options(arch, schedule, schedule_seed, drop_barrier)
    lib = _library()
    num_reqs = cu.numel() - 1
    num_rows, vocab = logits.shape
    out_buf, out = _fenced_int32((num_reqs, width + 1), -1)
    acc_buf, accepted = _fenced_int32((num_reqs,), 0)
    if num_reqs == 0:  # as the binding: nothing to launch
        return ChainResult(out.clone(), accepted.clone())
    code = _DTYPE_CODES[logits.dtype]
    block = block and probs is not None
    if block:
        ws_bytes = int(lib.specdec_emu_chain_block_workspace_bytes(num_reqs, vocab))
    else:
        ws_bytes = int(lib.specdec_emu_chain_workspace_bytes(arch, vocab, code, num_rows))
    ws = _fenced_bytes(ws_bytes, torch.Generator().manual_seed(options[1]))
    probs_code = _DTYPE_CODES[probs.dtype] if probs is not None else 0
    threshold_buf = _fenced_threshold(row_threshold, num_rows)

    def launch() -> int:
        return lib.specdec_emu_verify_chain(
            _ptr(logits), code, vocab, num_rows, _ptr(drafts), _ptr(cu), num_reqs, _ptr(probs), probs_code,
            _ptr(temp), _ptr(tk), _ptr(tp), _ptr(sd), _ptr(pos), width + 1, _ptr(out), _ptr(accepted),
            _threshold_ptr(threshold_buf), ws.data_ptr() + 4 * _CANARY, arch, int(block),
        )

    _run(lib, options, launch)
    _return_threshold(threshold_buf, row_threshold)
    _check_fence(out_buf, _CANARY, _CANARY_VALUE, "output_token_ids")
    _check_fence(acc_buf, _CANARY, _CANARY_VALUE, "num_accepted")
    _check_fence(ws, 4 * _CANARY, 0x5A, "the workspace")
    return ChainResult(out.clone(), accepted.clone())


def verify_tree(
    target_logits: torch.Tensor,
    node_token_ids: torch.Tensor,
    parent: torch.Tensor,
    cu_num_nodes: torch.Tensor,
    draft_probs: torch.Tensor | None = None,
    temperature: torch.Tensor | None = None,
    top_k: torch.Tensor | None = None,
    top_p: torch.Tensor | None = None,
    seed: torch.Tensor | None = None,
    position: torch.Tensor | None = None,
    sibling_sampling: str = "iid",
    *,
    method: str = "token",
    max_depth: int | None = None,
    validate: bool = True,
    arch: int = ARCHS["h200"],
    schedule: str = "forward",
    schedule_seed: int = 0,
    drop_barrier: str | None = None,
    row_threshold: torch.Tensor | None = None,
) -> TreeResult:
    """``specdec_kernels.verify_tree`` on CPU tensors through the emulated CUDA kernels of ``arch``;
    ``method="traversal"`` with draft probabilities runs the traversal kernel (traversal.cuh), as the
    binding does (deterministic trees run the token-level walk). ``row_threshold`` [N] float32 or None: as
    :func:`verify_chain`'s."""
    traversal = api._check_method(method, "tree") == "tree_traversal"
    args = api.checked_tree_args(
        target_logits, node_token_ids, parent, cu_num_nodes, draft_probs, temperature, top_k, top_p, seed, position,
        sibling_sampling, max_depth=max_depth, validate=validate,
    )
    logits, tokens, par, cu, probs, temp, tk, tp, sd, pos, sibling, depth = args
    _check_device({"target_logits": logits})
    options = _options(arch, schedule, schedule_seed, drop_barrier)
    lib = _library()
    num_reqs = cu.numel() - 1
    vocab = logits.shape[1]
    out_buf, out = _fenced_int32((num_reqs, depth + 1), -1)
    nodes_buf, nodes = _fenced_int32((num_reqs, depth + 1), -1)
    acc_buf, accepted = _fenced_int32((num_reqs,), 0)
    if num_reqs == 0:
        return TreeResult(out.clone(), nodes.clone(), accepted.clone())
    code = _DTYPE_CODES[logits.dtype]
    traversal = traversal and probs is not None
    if traversal:
        without = int(sibling == "without_replacement")
        ws_bytes = int(lib.specdec_emu_tree_traversal_workspace_bytes(num_reqs, depth + 1, vocab, without))
    else:
        ws_bytes = max(int(lib.specdec_emu_tree_workspace_bytes(num_reqs, vocab, int(probs is not None))), 4)
    ws = _fenced_bytes(ws_bytes, torch.Generator().manual_seed(options[1]))
    probs_code = _DTYPE_CODES[probs.dtype] if probs is not None else 0
    threshold_buf = _fenced_threshold(row_threshold, logits.shape[0])

    def launch() -> int:
        return lib.specdec_emu_verify_tree(
            _ptr(logits), code, vocab, logits.shape[0], _ptr(tokens), _ptr(par), _ptr(cu), num_reqs, _ptr(probs),
            probs_code, _ptr(temp), _ptr(tk), _ptr(tp), _ptr(sd), _ptr(pos), int(sibling == "without_replacement"), depth,
            _ptr(out), _ptr(nodes), _ptr(accepted), _threshold_ptr(threshold_buf), ws.data_ptr() + 4 * _CANARY, arch,
            int(traversal),
        )

    _run(lib, options, launch)
    _return_threshold(threshold_buf, row_threshold)
    _check_fence(out_buf, _CANARY, _CANARY_VALUE, "output_token_ids")
    _check_fence(nodes_buf, _CANARY, _CANARY_VALUE, "accepted_nodes")
    _check_fence(acc_buf, _CANARY, _CANARY_VALUE, "num_accepted")
    _check_fence(ws, 4 * _CANARY, 0x5A, "the workspace")
    return TreeResult(out.clone(), nodes.clone(), accepted.clone())


# ----------------------------------------------------------------------------------------------------
# Dry runs and self-tests
# ----------------------------------------------------------------------------------------------------

def plan_chain(vocab_size: int, dtype: torch.dtype, num_rows: int, num_reqs: int, *, stochastic: bool,
               truncated: bool, arch: int = ARCHS["h200"], method: str = "token") -> list[Launch]:
    """The launches ``verify_chain`` makes for these shapes on ``arch``, checked against the device's
    limits (:class:`EmulationError` otherwise) without running them or allocating anything."""
    lib = _library()
    block = api._check_method(method, "chain") == "chain_block" and stochastic
    _run(lib, _options(arch, "forward", 0, None, dry_run=True), lambda: lib.specdec_emu_plan_chain(
        arch, vocab_size, _DTYPE_CODES[dtype], num_rows, num_reqs, int(stochastic), int(truncated), int(block)))
    return last_launches()


def plan_tree(vocab_size: int, dtype: torch.dtype, num_reqs: int, *, arch: int = ARCHS["h200"],
              method: str = "token") -> list[Launch]:
    """The launches ``verify_tree`` makes for these shapes on ``arch`` (dry run, as :func:`plan_chain`);
    ``method="traversal"`` plans the traversal kernel (stochastic trees)."""
    lib = _library()
    traversal = api._check_method(method, "tree") == "tree_traversal"
    _run(lib, _options(arch, "forward", 0, None, dry_run=True),
         lambda: lib.specdec_emu_plan_tree(arch, vocab_size, _DTYPE_CODES[dtype], num_reqs, int(traversal)))
    return last_launches()


def run_selftest(kernel: str, out: torch.Tensor, *, grid: tuple[int, int] = (1, 1), block: int = 32,
                 dynamic_smem: int = 0, arg: int = 0, schedule: str = "forward", schedule_seed: int = 0,
                 max_rounds: int = 0) -> torch.Tensor:
    """Run one of the emulation's own test kernels (``csrc/cuda_emulation/selftest.cpp``) on ``out`` (int32)."""
    if out.dtype != torch.int32 or not out.is_contiguous():
        raise TypeError("out must be a contiguous int32 tensor")
    lib = _library()
    options = _options(ARCHS["h200"], schedule, schedule_seed, None, max_rounds=max_rounds)

    def launch() -> int:
        code = lib.specdec_emu_selftest(kernel.encode(), grid[0], grid[1], block, dynamic_smem, arg, out.data_ptr())
        if code == 2:
            raise ValueError(f"unknown self-test kernel {kernel!r}")
        return code

    _run(lib, options, launch)
    return out
