// Schemas of the specdec:: torch ops (one place for bindings.cpp and the device implementations).
// row_threshold (the sampling mask, specdec_kernels/sampling_mask.py): a float32 [rows] tensor the kernel
// writes each decided row's kept-set threshold into; None (the default) writes nothing.
#pragma once

namespace specdec {

inline constexpr const char* kVerifyChainSchema =
    "verify_chain(Tensor target_logits, Tensor draft_token_ids, Tensor cu_num_draft_tokens, "
    "Tensor? draft_probs, Tensor temperature, Tensor? top_k, Tensor? top_p, Tensor seed, Tensor position, "
    "int max_draft_len, Tensor(a!)? row_threshold=None) -> (Tensor, Tensor)";

inline constexpr const char* kVerifyTreeSchema =
    "verify_tree(Tensor target_logits, Tensor node_token_ids, Tensor parent, Tensor cu_num_nodes, "
    "Tensor? draft_probs, Tensor temperature, Tensor? top_k, Tensor? top_p, Tensor seed, Tensor position, "
    "str sibling_sampling, int max_depth, Tensor(a!)? row_threshold=None) -> (Tensor, Tensor, Tensor)";

// Block verification of chains and traversal verification of trees: the same signatures.
inline constexpr const char* kVerifyChainBlockSchema =
    "verify_chain_block(Tensor target_logits, Tensor draft_token_ids, Tensor cu_num_draft_tokens, "
    "Tensor? draft_probs, Tensor temperature, Tensor? top_k, Tensor? top_p, Tensor seed, Tensor position, "
    "int max_draft_len, Tensor(a!)? row_threshold=None) -> (Tensor, Tensor)";

inline constexpr const char* kVerifyTreeTraversalSchema =
    "verify_tree_traversal(Tensor target_logits, Tensor node_token_ids, Tensor parent, Tensor cu_num_nodes, "
    "Tensor? draft_probs, Tensor temperature, Tensor? top_k, Tensor? top_p, Tensor seed, Tensor position, "
    "str sibling_sampling, int max_depth, Tensor(a!)? row_threshold=None) -> (Tensor, Tensor, Tensor)";

}  // namespace specdec
