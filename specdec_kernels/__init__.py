"""specdec-kernels: provably lossless speculative-decoding verification kernels.

Public API (docs/design.md §3)::

    import specdec_kernels as sk
    res = sk.verify_chain(target_logits, draft_token_ids, cu_num_draft_tokens, ...)
"""

from .api import ChainResult, SamplingMask, TreeResult, available_backends, verify_chain, verify_tree

__version__ = "0.1.0"

__all__ = ["ChainResult", "SamplingMask", "TreeResult", "available_backends", "verify_chain", "verify_tree", "__version__"]
