"""specdec_kernels.drafters: EAGLE-3, MTP and draft-model drafters behind one batched protocol.

See ``base.py`` for the protocol (prefill / propose / propose_tree / commit, slots) a rollout engine
drives and ``cached.py`` for the driver every head shares. The heads' decoder layers are the one Qwen3
implementation of ``specdec_kernels.models``.
"""

from .base import STREAM_DRAFT, Drafter, DraftProposal, TreeProposal
from .cached import CachedDrafter
from .draft_model import DraftModelDrafter, DraftModelHead
from .eagle3 import Eagle3Config, Eagle3Drafter, Eagle3Head, default_feature_layers
from .features import TargetForward, capture_target_features
from .mtp import MtpConfig, MtpDrafter, MtpHead

__all__ = [
    "STREAM_DRAFT", "CachedDrafter", "DraftProposal", "Drafter", "TreeProposal",
    "DraftModelDrafter", "DraftModelHead",
    "Eagle3Config", "Eagle3Drafter", "Eagle3Head", "default_feature_layers",
    "TargetForward", "capture_target_features",
    "MtpConfig", "MtpDrafter", "MtpHead",
]
