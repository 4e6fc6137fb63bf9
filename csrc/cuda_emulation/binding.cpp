// C interface of the CUDA host emulation, for specdec_kernels/exactness/cuda_emulation.py (ctypes). It does what
// the torch binding csrc/cuda/ops_cuda.cpp does after its checks, on host memory the caller allocated:
// fill the argument structs, call the real launchers (csrc/cuda/*.cu compiled for the host), report
// the first emulation error.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "emu.h"
#include "specdec/cuda/cuda_api.h"

#define SPECDEC_EMU_API extern "C" __attribute__((visibility("default")))

namespace {

std::string g_drop_file;

specdec::DType dtype_of(int code) { return static_cast<specdec::DType>(code); }

}  // namespace

// schedule: 0 forward, 1 reverse, 2 random (seeded); drop_file / drop_line: a __syncthreads to skip
// (planted bug; empty file: none); arch: compute capability x 10 of the emulated device (90, 100);
// dry_run: check and log launches without running them; max_rounds: 0 keeps the default.
SPECDEC_EMU_API void specdec_emu_configure(int schedule, uint64_t seed, const char* drop_file, int drop_line, int arch,
                                           int dry_run, uint64_t max_rounds) {
  g_drop_file = drop_file != nullptr ? drop_file : "";
  specdec_emu::Options o;
  o.schedule = static_cast<specdec_emu::Schedule>(schedule);
  o.seed = seed;
  o.drop_file = g_drop_file.empty() ? nullptr : g_drop_file.c_str();
  o.drop_line = drop_line;
  o.device_arch = arch;
  o.dry_run = dry_run != 0;
  if (max_rounds > 0) o.max_rounds = max_rounds;
  specdec_emu::set_options(o);
  specdec_emu::reset();
}

SPECDEC_EMU_API const char* specdec_emu_error() { return specdec_emu::error(); }
SPECDEC_EMU_API const char* specdec_emu_barrier_sites() { return specdec_emu::barrier_sites(); }
SPECDEC_EMU_API int64_t specdec_emu_launch_count() { return static_cast<int64_t>(specdec_emu::launch_count()); }

// Launch i of the log: its kernel name (returned), grid[3], block[3] and dynamic shared memory bytes.
SPECDEC_EMU_API const char* specdec_emu_launch(int64_t i, uint32_t* grid, uint32_t* block, uint64_t* smem) {
  const specdec_emu::LaunchRecord* r = specdec_emu::launch_record(static_cast<size_t>(i));
  if (r == nullptr) return nullptr;
  grid[0] = r->grid.x, grid[1] = r->grid.y, grid[2] = r->grid.z;
  block[0] = r->block.x, block[1] = r->block.y, block[2] = r->block.z;
  *smem = r->dynamic_smem;
  return r->name;
}

// Entry i of the launch-config table (returns the number of entries; i out of range fills nothing).
SPECDEC_EMU_API int specdec_emu_config_entry(int i, int* min_arch, int64_t* min_vocab, int* elem_bytes, int* threads,
                                             int64_t* slice) {
  constexpr int n = static_cast<int>(sizeof(specdec::cuda::kConfigTable) / sizeof(specdec::cuda::kConfigTable[0]));
  if (i >= 0 && i < n) {
    const specdec::cuda::ConfigEntry& e = specdec::cuda::kConfigTable[i];
    *min_arch = e.min_arch, *min_vocab = e.min_vocab, *elem_bytes = e.elem_bytes;
    *threads = e.config.threads, *slice = e.config.slice;
  }
  return n;
}

SPECDEC_EMU_API uint64_t specdec_emu_chain_workspace_bytes(int arch, int64_t vocab, int dtype, int64_t num_rows) {
  return specdec::cuda::chain_workspace_bytes(num_rows, specdec::cuda::chain_slices(arch, vocab, dtype_of(dtype)));
}

SPECDEC_EMU_API uint64_t specdec_emu_tree_workspace_bytes(int64_t num_reqs, int64_t vocab, int stochastic) {
  return specdec::cuda::tree_workspace_bytes(num_reqs, vocab, stochastic != 0);
}

SPECDEC_EMU_API uint64_t specdec_emu_chain_block_workspace_bytes(int64_t num_reqs, int64_t vocab) {
  return specdec::cuda::chain_block_workspace_bytes(num_reqs, vocab);
}

SPECDEC_EMU_API uint64_t specdec_emu_tree_traversal_workspace_bytes(int64_t num_reqs, int64_t width, int64_t vocab,
                                                                    int without_replacement) {
  return specdec::cuda::tree_traversal_workspace_bytes(num_reqs, width, vocab, without_replacement != 0);
}

SPECDEC_EMU_API int specdec_emu_verify_chain(const void* logits, int logits_dtype, int64_t vocab, int64_t num_rows,
                                             const int64_t* draft_ids, const int64_t* cu, int64_t num_reqs,
                                             const void* draft_probs, int probs_dtype, const float* temperature,
                                             const int32_t* top_k, const float* top_p, const int64_t* seed,
                                             const int64_t* position, int64_t out_width, int32_t* out_tokens,
                                             int32_t* num_accepted, float* row_threshold, void* workspace, int arch,
                                             int block) {
  specdec::CudaChainArgs a{};
  a.logits = logits;
  a.logits_dtype = dtype_of(logits_dtype);
  a.vocab = vocab;
  a.num_rows = num_rows;
  a.draft_ids = draft_ids;
  a.cu = cu;
  a.num_reqs = num_reqs;
  a.draft_probs = draft_probs;
  a.probs_dtype = dtype_of(probs_dtype);
  a.temperature = temperature;
  a.top_k = top_k;
  a.top_p = top_p;
  a.seed = seed;
  a.position = position;
  a.out_width = out_width;
  a.out_tokens = out_tokens;
  a.num_accepted = num_accepted;
  a.row_threshold = row_threshold;
  if (block) {
    specdec::cuda::launch_verify_chain_block(a, arch, workspace, nullptr);
  } else {
    specdec::cuda::launch_verify_chain(a, arch, workspace, nullptr);
  }
  return specdec_emu::error() == nullptr ? 0 : 1;
}

SPECDEC_EMU_API int specdec_emu_verify_tree(const void* logits, int logits_dtype, int64_t vocab, int64_t num_nodes,
                                            const int64_t* node_token_ids, const int64_t* parent, const int64_t* cu,
                                            int64_t num_reqs, const void* draft_probs, int probs_dtype,
                                            const float* temperature, const int32_t* top_k, const float* top_p,
                                            const int64_t* seed, const int64_t* position, int without_replacement,
                                            int64_t max_depth, int32_t* out_tokens, int32_t* accepted_nodes,
                                            int32_t* num_accepted, float* row_threshold, void* workspace, int arch,
                                            int traversal) {
  specdec::CudaTreeArgs a{};
  a.logits = logits;
  a.logits_dtype = dtype_of(logits_dtype);
  a.vocab = vocab;
  a.num_nodes = num_nodes;
  a.node_token_ids = node_token_ids;
  a.parent = parent;
  a.cu = cu;
  a.num_reqs = num_reqs;
  a.draft_probs = draft_probs;
  a.probs_dtype = dtype_of(probs_dtype);
  a.temperature = temperature;
  a.top_k = top_k;
  a.top_p = top_p;
  a.seed = seed;
  a.position = position;
  a.without_replacement = without_replacement != 0;
  a.max_depth = max_depth;
  a.out_tokens = out_tokens;
  a.accepted_nodes = accepted_nodes;
  a.num_accepted = num_accepted;
  a.row_threshold = row_threshold;
  if (traversal) {
    specdec::cuda::launch_verify_tree_traversal(a, arch, workspace, nullptr);
  } else {
    specdec::cuda::launch_verify_tree(a, arch, static_cast<float*>(workspace), nullptr);
  }
  return specdec_emu::error() == nullptr ? 0 : 1;
}

// Dry runs (specdec_emu_configure(..., dry_run=1) first): the launches verify_chain / verify_tree (or their
// block / traversal kernels, with the flag set) would make for these shapes, checked against the device
// limits and logged; no memory is touched.
SPECDEC_EMU_API int specdec_emu_plan_chain(int arch, int64_t vocab, int dtype, int64_t num_rows, int64_t num_reqs,
                                           int stochastic, int truncated, int block) {
  static unsigned char dummy[64];
  specdec::CudaChainArgs a{};
  a.logits_dtype = dtype_of(dtype);
  a.vocab = vocab;
  a.num_rows = num_rows;
  a.num_reqs = num_reqs;
  a.draft_probs = stochastic ? dummy : nullptr;
  a.top_k = truncated ? reinterpret_cast<const int32_t*>(dummy) : nullptr;
  if (block) {
    specdec::cuda::launch_verify_chain_block(a, arch, dummy, nullptr);
  } else {
    specdec::cuda::launch_verify_chain(a, arch, dummy, nullptr);
  }
  return specdec_emu::error() == nullptr ? 0 : 1;
}

SPECDEC_EMU_API int specdec_emu_plan_tree(int arch, int64_t vocab, int dtype, int64_t num_reqs, int traversal) {
  static float dummy[16];
  specdec::CudaTreeArgs a{};
  a.logits_dtype = dtype_of(dtype);
  a.vocab = vocab;
  a.num_reqs = num_reqs;
  if (traversal) {
    specdec::cuda::launch_verify_tree_traversal(a, arch, dummy, nullptr);
  } else {
    specdec::cuda::launch_verify_tree(a, arch, dummy, nullptr);
  }
  return specdec_emu::error() == nullptr ? 0 : 1;
}
