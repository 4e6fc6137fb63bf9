"""What the audit runs against: :class:`AuditTarget` and the verifiers every adapter shares.

A target wraps a *verifier*: a callable with ``verify_chain``'s positional signature (``target_logits,
draft_token_ids, cu_num_draft_tokens, draft_probs, temperature, top_k, top_p, seed, position``, plus a
``min_p=`` keyword where ``supports`` says so) returning an object with ``output_token_ids`` [B, K + 1]
(-1 padded) and ``num_accepted`` [B]. Adapters translate that call into a peer's own signature and the
peer's output back. ``mutant(bug)`` returns the same adapter path with the peer's verification replaced
by one of the suite's planted-bug samplers, so the audit can show that it would have caught a bug in that
very harness. A target that is a whole generation loop rather than a verifier (``transformers-assisted``)
carries a :class:`System`: its own cases, run by the audit in the verifier families' place. The built-in
targets and ``module:function`` lookup are in :mod:`.targets`; the peer adapters import only this module, so
that the registry imports them and nothing imports it back.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

import torch

from ..exactness.markov_models import Verifier

__all__ = ["ALL_ARGUMENTS", "AuditTarget", "FEATURES", "System", "TargetError", "device_verifier", "reference_verifier"]

FEATURES = ("min_p", "per_request_seed", "validation", "method")
"""``supports`` entries: ``min_p`` (takes a ``min_p=`` keyword), ``per_request_seed`` (a request's tokens
depend only on its own inputs, seed and position: replay and batch invariance apply), ``validation``
(takes our argument types directly, so the whole bad-input table applies), ``method`` (takes ``method=``)."""


class TargetError(ValueError):
    """The TARGET cannot be resolved or cannot run here; the message is one line for the user."""


class System(Protocol):
    """An end-to-end system under audit (drafting, verification and sampling all its own): the families it has
    cases in, their names in run order, and ``run(family, options)`` yielding one ``Outcome`` per selected case
    (``options.selected``), as :func:`.families.run_family` does for a verifier."""

    families: tuple[str, ...]

    def case_names(self, family: str) -> list[str]: ...

    def run(self, family: str, options) -> Iterator: ...


@dataclass(frozen=True)
class AuditTarget:
    """One verifier under audit.

    ``verify`` is None when the target cannot run on this machine; ``refusal`` then says why in one line.
    ``value_arguments`` names the arguments whose values the adapter hands to the peer unchanged (the
    "value" rows of the bad-input table run only for those). ``versions`` records the peer's version.
    ``mutant_base`` is the mutant path with the unmutated reference verification in the bug's place: a
    planted bug whose counts equal its counts is reported inert (it cannot act on this path). ``system``: the
    target is a whole generation loop whose own cases run instead of the verifier families' (``verify`` is
    then the verification step it calls, not run by the audit).
    """

    name: str
    description: str
    verify: Verifier | None
    refusal: str | None = None
    supports: frozenset[str] = frozenset()
    mutant: Callable[[str], Verifier] | None = None
    mutant_base: Verifier | None = None
    value_arguments: frozenset[str] = frozenset()
    versions: dict[str, str] = field(default_factory=dict)
    system: System | None = None

    def __post_init__(self) -> None:
        unknown = set(self.supports) - set(FEATURES)
        if unknown:
            raise ValueError(f"supports holds unknown features {sorted(unknown)}; known: {FEATURES}")
        if (self.verify is None) == (self.refusal is None):
            raise ValueError("give exactly one of verify (runs here) and refusal (why it cannot)")


ALL_ARGUMENTS = frozenset({"target_logits", "draft_token_ids", "cu_num_draft_tokens", "draft_probs",
                           "temperature", "top_k", "top_p", "seed", "position"})


def reference_verifier(*args, **kwargs):
    """``verify_chain(..., backend="reference", validate=False)``: the unmutated twin of every mutant."""
    from .. import verify_chain

    kwargs.pop("backend", None)
    kwargs.pop("validate", None)  # adapters that call verify_chain unvalidated (the vLLM drop-ins) pass it too
    return verify_chain(*args, backend="reference", validate=False, **kwargs)


def device_verifier(verify: Verifier, device: torch.device | str) -> Verifier:
    """``verify`` on ``device``: tensor arguments moved there, the result's tensors back to the CPU."""
    device = torch.device(device)
    if device.type == "cpu":
        return verify

    @functools.wraps(verify)
    def moved(*args, **kwargs):
        args = [a.to(device) if isinstance(a, torch.Tensor) else a for a in args]
        kwargs = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
        res = verify(*args, **kwargs)
        return type(res)(*(x.cpu() for x in res))

    return moved
