"""Compile every Triton kernel launch of the verifiers and drafter heads for a CUDA target, on a machine
without a GPU (test-only).

CPU machines run the Triton kernels in Triton's interpreter, which executes Python semantics: a kernel
the GPU compiler refuses (a global that is not a ``tl.constexpr``, a type the code generator cannot
unify across a branch or a loop) still passes every interpreted test. This tool runs the public API on
small CPU inputs with every launch intercepted (nothing executes), then lowers each distinct launch
(kernel, argument types, constexprs, ``num_warps``) to Triton IR for the target with Triton's own front
end and its TTIR passes, as a GPU would before generating code.

    python -m tests.harness.triton_compile [--arch 90] [--arch 100]

Prints one line per compiled launch and exits 1 with the compiler's message on the first failure. It
must start with compiled kernels (``TRITON_INTERPRET`` unset or 0): the kernels are made interpreted or
compiled when their modules are imported, so it sets ``TRITON_INTERPRET=0`` itself when run as a module.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Iterator
from typing import Any

_DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "int64": "i64", "int32": "i32",
           "int16": "i16", "int8": "i8", "uint8": "u8", "bool": "i1"}


def capture_launches() -> list[tuple[Any, tuple, dict]]:
    """Run verify_chain / verify_tree (token, block, traversal; every sampling option and logits dtype) and
    the drafter heads on CPU tensors with every JITFunction launch recorded instead of run; one record
    per distinct (kernel, argument types, non-tensor arguments)."""
    import torch
    import triton

    from specdec_kernels import api

    seen: dict[tuple, tuple[Any, tuple, dict]] = {}

    def record(self, *args, grid, warmup, **kwargs):
        def kind(v):
            return ("tensor", str(v.dtype)) if isinstance(v, torch.Tensor) else (type(v).__name__, v)

        key = (self.fn.__module__, self.fn.__qualname__, tuple(kind(a) for a in args),
               tuple(sorted((k, kind(v)) for k, v in kwargs.items())))
        seen.setdefault(key, (self, args, kwargs))
        for v in (*args, *kwargs.values()):  # nothing ran: give host code after the launch valid indices
            if isinstance(v, torch.Tensor) and not v.is_floating_point():
                v.zero_()

    previous_run, previous_usable = triton.runtime.JITFunction.run, api._triton_usable
    triton.runtime.JITFunction.run = record
    api._triton_usable = lambda device: True  # the API refuses CPU tensors for Triton outside the interpreter
    try:
        for call in _api_calls():
            call()
    finally:
        triton.runtime.JITFunction.run, api._triton_usable = previous_run, previous_usable
    return list(seen.values())


def _api_calls() -> Iterator:
    """Zero-argument calls covering the launch variants, each on inputs of its own (a launch leaves its integer
    tensors zeroed)."""
    import torch

    from specdec_kernels import verify_chain, verify_tree
    from specdec_kernels.drafters import head_ops

    gen = torch.Generator().manual_seed(0)
    vocab, batch = 300, 3
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for probs in (False, True):
            for top_k, top_p in ((False, False), (True, False), (False, True), (True, True)):
                case = (batch, vocab, dtype, gen, probs, top_k, top_p)
                # The sampling mask's threshold stores (WRITE_THRESHOLD) are one more variant of each launch.
                for mask in (False, True) if dtype == torch.float32 else (False,):
                    for method in ("token", "block"):
                        yield lambda c=case, m=method, r=mask: verify_chain(**_chain_inputs(*c), backend="triton",
                                                                            method=m, return_mask=r)
                    for sibling in ("iid", "without_replacement"):
                        for method in ("token", "traversal"):
                            yield lambda c=case, s=sibling, m=method, r=mask: verify_tree(
                                **_tree_inputs(*c, s), backend="triton", method=m, return_mask=r)
    for dtype in (torch.float32, torch.bfloat16):
        x, w = torch.randn(5, 3 * 40, generator=gen).to(dtype), torch.randn(24, 3 * 40, generator=gen).to(dtype)
        for norm in (None, (torch.rand(3, 40, generator=gen) + 0.5).to(dtype)):
            yield lambda x=x, n=norm, w=w: head_ops.fuse_features(x, n, w, 1e-6, "triton")
        h, lm = torch.randn(6, 32, generator=gen).to(dtype), torch.randn(90, 32, generator=gen).to(dtype)
        for k in (1, 4):
            yield lambda h=h, lm=lm, k=k: head_ops.head_topk(h, lm, torch.zeros(90, dtype=torch.int64), k, "triton")
            yield lambda h=h, lm=lm, k=k: head_ops.head_sample(
                h, lm, torch.zeros(90, dtype=torch.int64), 150, torch.tensor([1.0, 0.0, 0.5, 2.0, 1.0, 0.7]),
                torch.arange(6), torch.arange(6) + 100, k, "triton")


def _chain_inputs(batch, vocab, dtype, gen, probs, top_k, top_p) -> dict:
    import torch

    lengths = torch.tensor([3, 0, 2])[:batch]
    cu = torch.zeros(batch + 1, dtype=torch.int64)
    cu[1:] = lengths.cumsum(0)
    drafts = int(cu[-1])
    return dict(target_logits=torch.randn(drafts + batch, vocab, generator=gen).to(dtype),
                draft_token_ids=torch.randint(0, vocab, (drafts,), generator=gen), cu_num_draft_tokens=cu,
                draft_probs=torch.softmax(torch.randn(drafts, vocab, generator=gen), -1) if probs else None,
                **_sampling(batch, top_k, top_p))


def _tree_inputs(batch, vocab, dtype, gen, probs, top_k, top_p, sibling) -> dict:
    import torch

    parents = [-1, 0, 0, 1, 1, 2]  # one shape per request: depth 2, distinct sibling tokens
    n = len(parents)
    tokens = torch.stack([torch.randperm(vocab, generator=gen)[:n] for _ in range(batch)]).reshape(-1)
    return dict(target_logits=torch.randn(batch * n, vocab, generator=gen).to(dtype), node_token_ids=tokens,
                parent=torch.tensor(parents).repeat(batch), cu_num_nodes=torch.arange(batch + 1) * n,
                draft_probs=torch.softmax(torch.randn(batch * n, vocab, generator=gen), -1) if probs else None,
                sibling_sampling=sibling, **_sampling(batch, top_k, top_p))


def _sampling(batch, top_k, top_p) -> dict:
    """Per-request sampling (random, greedy, random at T = 0.7), with top-k / top-p when asked."""
    import torch

    out = dict(temperature=torch.tensor([1.0, 0.0, 0.7])[:batch], seed=torch.arange(batch),
               position=torch.arange(batch) * 7)
    if top_k:
        out["top_k"] = torch.tensor([5, 0, 40], dtype=torch.int32)[:batch]
    if top_p:
        out["top_p"] = torch.tensor([0.9, 1.0, 0.5])[:batch]
    return out


def signature(kernel, args: tuple, kwargs: dict) -> tuple[dict, dict]:
    """Triton's (signature, constexprs) of one launch: pointers by element type, scalars by value."""
    import torch

    values = list(args) + [None] * (len(kernel.params) - len(args))
    for i, p in enumerate(kernel.params):
        if p.name in kwargs:
            values[i] = kwargs[p.name]
    sig, consts = {}, {}
    for i, (p, v) in enumerate(zip(kernel.params, values, strict=True)):
        if p.is_constexpr or v is None:
            sig[p.name] = "constexpr"
            consts[(i,)] = v
        elif isinstance(v, torch.Tensor):
            sig[p.name] = "*" + _DTYPES[str(v.dtype).removeprefix("torch.")]
        elif isinstance(v, bool):
            sig[p.name] = "i1"
        elif isinstance(v, int):
            sig[p.name] = "i32" if -(2**31) <= v < 2**31 else "i64"
        elif isinstance(v, float):
            sig[p.name] = "fp32"
        else:
            raise TypeError(f"{kernel.fn.__qualname__}: argument {p.name} of type {type(v).__name__}")
    return sig, consts


def compile_launch(kernel, args: tuple, kwargs: dict, arch: int) -> None:
    """Lower one launch to Triton IR for sm_<arch> and run the TTIR passes (raises the compiler's error)."""
    from triton._C.libtriton import ir
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import CUDABackend
    from triton.compiler.compiler import ASTSource

    target = GPUTarget("cuda", arch, 32)
    backend = CUDABackend(target)
    options = backend.parse_options({k: kwargs[k] for k in ("num_warps", "num_stages") if k in kwargs})
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    sig, consts = signature(kernel, args, kwargs)
    module = ASTSource(kernel, sig, consts).make_ir(target, options, backend.get_codegen_implementation(options),
                                                    backend.get_module_map(), context)
    backend.make_ttir(module, {}, options, arch)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", type=int, action="append", help="SM version, e.g. 90 (default) or 100")
    args = parser.parse_args(argv)
    import triton

    if triton.knobs.runtime.interpret:
        print("triton_compile: TRITON_INTERPRET is set, so the kernels were made interpreted; unset it",
              file=sys.stderr)
        return 2
    launches = capture_launches()
    for arch in args.arch or [90]:
        for kernel, a, kw in launches:
            scalars = {k: v for k, v in kw.items() if not hasattr(v, "dtype")}
            start = time.perf_counter()
            try:
                compile_launch(kernel, a, kw, arch)
            except Exception as exc:  # the compiler's own error, with the kernel's source line
                print(f"FAILED sm_{arch} {kernel.fn.__module__}.{kernel.fn.__qualname__} {scalars}\n{exc}",
                      file=sys.stderr)
                return 1
            print(f"ok sm_{arch} {kernel.fn.__qualname__} {scalars} ({time.perf_counter() - start:.2f} s)")
    print(f"{len(launches)} launches compiled for sm_{', sm_'.join(str(a) for a in args.arch or [90])}")
    return 0


if __name__ == "__main__":
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        os.environ["TRITON_INTERPRET"] = "0"
        os.execv(sys.executable, [sys.executable, "-m", "tests.harness.triton_compile", *sys.argv[1:]])
    sys.exit(main())
