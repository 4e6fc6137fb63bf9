"""CUDA graphs for the engine's round forward (``--device cuda``): the autoregressive decode step and the
speculative round's (k + 1)-row verification forward, each captured once per batch shape and replayed.

A round forward qualifies when every slot is active (the policy reads the cache as views, no row gather)
and the rows are causal (chain and autoregressive rounds; a tree round's ancestor mask and a partial batch
run eagerly). Its shapes are then static: ``input_ids`` [S, n], ``start`` [S], and the attention span is
the whole cache (``kv_len = cache.max_len``; ``Qwen3.step`` masks every slot past ``start + i``), so the
replay needs no host-side length. A graph holds the addresses of the cache and of the fused inference
weights: the engine keeps one cache per slot count on cuda and calls :meth:`GraphedStep.reset` on weight
sync (``Qwen3.sync_inference_weights`` builds new tensors), which recaptures at the next round.

The capture itself is injected (``capture``): :func:`cuda_graph` on a GPU; the CPU tests pass
:class:`EagerGraph`, which replays by calling the function again, to check the static-buffer plumbing and
that a full-span forward gives the engine the same tokens.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from specdec_kernels.models import KVCache

Step = Callable[..., tuple[torch.Tensor, list[torch.Tensor]]]


class EagerGraph:
    """A stand-in for a captured graph: :meth:`replay` calls ``fn`` again (same static inputs, same
    outputs written into the same tensors it returned at capture)."""

    def __init__(self, fn: Callable[[], tuple[torch.Tensor, list[torch.Tensor]]]) -> None:
        self.fn = fn
        self.outputs = fn()

    def replay(self) -> None:
        logits, hidden = self.fn()
        self.outputs[0].copy_(logits)
        for dst, src in zip(self.outputs[1], hidden, strict=True):
            dst.copy_(src)


class _CudaGraph:
    """``fn`` warmed up on a side stream, then captured into one ``torch.cuda.CUDAGraph``."""

    def __init__(self, fn: Callable[[], tuple[torch.Tensor, list[torch.Tensor]]]) -> None:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):  # lazy allocations (RoPE tables, cuBLAS workspaces) happen outside the capture
                fn()
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.outputs = fn()

    def replay(self) -> None:
        self.graph.replay()


def cuda_graph(fn: Callable[[], tuple[torch.Tensor, list[torch.Tensor]]]) -> _CudaGraph:
    """Capture ``fn`` (no arguments; reads and writes fixed tensors) as a CUDA graph."""
    return _CudaGraph(fn)


class GraphedStep:
    """A policy step (``decode.PolicyStep``'s call signature) whose full-batch causal rounds replay graphs.

    The warm-up and the capture run the forward on the round's real inputs; its cache writes (keys/values
    at ``start + i``) are the replay's own, so capturing on the first round of a shape loses nothing.
    """

    def __init__(self, step: Step, capture: Callable = cuda_graph) -> None:
        self.step = step
        self.capture = capture
        self.graphs: dict[tuple, tuple[KVCache, torch.Tensor, torch.Tensor, object]] = {}

    def reset(self) -> None:
        """Drop every graph (the weights they read were replaced)."""
        self.graphs.clear()

    def __call__(self, input_ids: torch.Tensor, cache: KVCache, rows: torch.Tensor | None, start: torch.Tensor,
                 kv_len: int, depth: torch.Tensor | None = None, tree_mask: torch.Tensor | None = None,
                 capture: tuple[int, ...] = ()) -> tuple[torch.Tensor, list[torch.Tensor]]:
        if rows is not None or depth is not None or tree_mask is not None:
            return self.step(input_ids, cache, rows, start, kv_len, depth=depth, tree_mask=tree_mask,
                             capture=capture)
        key = (tuple(input_ids.shape), capture, id(cache))
        entry = self.graphs.get(key)
        if entry is None or entry[0] is not cache:
            ids, st = input_ids.clone(), start.clone()
            graph = self.capture(lambda: self.step(ids, cache, None, st, cache.max_len, capture=capture))
            self.graphs[key] = (cache, ids, st, graph)
        else:
            _, ids, st, graph = entry
            ids.copy_(input_ids)
            st.copy_(start)
        graph.replay()  # a capture records without running: the first round of a shape replays too
        return graph.outputs
