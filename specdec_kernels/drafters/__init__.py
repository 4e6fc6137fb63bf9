"""specdec_kernels.drafters: EAGLE-3, MTP and draft-model drafters behind one batched protocol.

See ``base.py`` for the protocol (prefill / propose / propose_tree / commit) a rollout engine drives.
"""

from .base import STREAM_DRAFT, Drafter, DraftProposal, TreeProposal
from .draft_model import DraftModelDrafter, DraftModelHead
from .eagle3 import Eagle3Config, Eagle3Drafter, Eagle3Head, default_feature_layers
from .features import TargetForward, capture_target_features
from .mtp import MtpConfig, MtpDrafter, MtpHead

__all__ = [
    "STREAM_DRAFT", "DraftProposal", "Drafter", "TreeProposal",
    "DraftModelDrafter", "DraftModelHead",
    "Eagle3Config", "Eagle3Drafter", "Eagle3Head", "default_feature_layers",
    "TargetForward", "capture_target_features",
    "MtpConfig", "MtpDrafter", "MtpHead",
]
