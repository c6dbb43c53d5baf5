// cuDNN's fused attention through the cudnn-frontend graph API (see fused_attention.h).
#include "backend/cuda/fused_attention.h"

#include <algorithm>
#include <cstdlib>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "backend/cuda/cuda_launch.h"
#include "core/error.h"

#if defined(BRISK_HAVE_CUDNN_FRONTEND)
#include <cudnn_frontend.h>
#include <dlfcn.h>

// The frontend's calls into libcudnn go through this handle
// (NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING).
namespace cudnn_frontend {
void* cudnn_dlhandle = nullptr;
}  // namespace cudnn_frontend
#endif

namespace brisk::cuda {

#if defined(BRISK_HAVE_CUDNN_FRONTEND)
namespace {

namespace fe = cudnn_frontend;
using Graph = fe::graph::Graph;
using TensorAttr = fe::graph::Tensor_attributes;

// The graphs' tensors by uid, so that a call maps pointers without keeping tensor handles.
enum Uid : int64_t {
  kQ = 1,
  kK,
  kV,
  kO,
  kStats,
  kBias,
  kSeed,
  kOffset,
  kDO,
  kDQ,
  kDK,
  kDV,
  kSeqLenQ,
  kSeqLenKV,
  kRaggedQKV,
  kRaggedOut,
  kRaggedStats
};

#define BRISK_STRINGIFY2(x) #x
#define BRISK_STRINGIFY(x) BRISK_STRINGIFY2(x)

struct Library {
  bool loaded = false;  // libcudnn opened, of a version fused attention needs
  bool ok = false;      // and a handle made (a GPU)
  std::string why;
  cudnnHandle_t handle = nullptr;
};

// Opens libcudnn of the major version the headers describe, as the dynamic linker finds it,
// else where the build found it; then makes the process's one handle (for the current GPU).
Library open_library() {
  Library lib;
  const std::string soname = "libcudnn.so." BRISK_STRINGIFY(CUDNN_MAJOR);
  void* h = dlopen(soname.c_str(), RTLD_NOW | RTLD_LOCAL);
#ifdef BRISK_CUDNN_BUILD_DIR
  if (!h)
    h = dlopen((std::string(BRISK_CUDNN_BUILD_DIR "/") + soname).c_str(), RTLD_NOW | RTLD_LOCAL);
#endif
  if (!h) {
    const char* err = dlerror();
    lib.why = "cannot load " + soname + ": " + (err ? err : "not found");
    return lib;
  }
  fe::cudnn_dlhandle = h;
  // The frontend opens the CUDA runtime itself and would take the first of libcudart.so.12 and .13
  // it finds; brisk's is the one it was built against (a user's own setting stays).
  const std::string cudart = "libcudart.so." + std::to_string(CUDART_VERSION / 1000);
  setenv("CUDNN_FRONTEND_CUDART_LIB_NAME", cudart.c_str(), 0);
  try {
    const size_t version = fe::detail::get_backend_version();
    if (version < 90000) {
      lib.why =
          soname + " reports version " + std::to_string(version) + ", fused attention needs 9";
      return lib;
    }
    lib.loaded = true;
    if (fe::detail::create_handle(&lib.handle) != CUDNN_STATUS_SUCCESS) {
      lib.why = "cudnnCreate failed";
      return lib;
    }
  } catch (const std::exception& e) {
    lib.why = e.what();
    return lib;
  }
  lib.ok = true;
  return lib;
}

Library& library() {
  static Library lib = open_library();
  return lib;
}

std::vector<int64_t> head_dims(const FusedAttentionShape& s, int64_t heads) {
  return {s.B, heads, s.T, s.D};
}
// q, k and v heads inside packed [B, T, (H + 2K) D]; the output and its gradient are [B, T, H D].
std::vector<int64_t> packed_strides(const FusedAttentionShape& s) {
  const int64_t row = (s.H + 2 * s.K) * s.D;
  return {s.T * row, s.D, row, 1};
}
std::vector<int64_t> out_strides(const FusedAttentionShape& s) {
  return {s.T * s.H * s.D, s.D, s.H * s.D, 1};
}

std::shared_ptr<TensorAttr> add_tensor(Graph& g, Uid uid, const char* name,
                                       std::vector<int64_t> dims, std::vector<int64_t> strides,
                                       fe::DataType_t type) {
  return g.tensor(TensorAttr()
                      .set_name(name)
                      .set_uid(uid)
                      .set_dim(std::move(dims))
                      .set_stride(std::move(strides))
                      .set_data_type(type));
}
void set_output(const std::shared_ptr<TensorAttr>& t, Uid uid, std::vector<int64_t> dims,
                std::vector<int64_t> strides) {
  t->set_output(true).set_uid(uid).set_dim(std::move(dims)).set_stride(std::move(strides));
}

struct Inputs {
  std::shared_ptr<TensorAttr> q, k, v, bias, seq_len_q, seq_len_kv, seed, offset;
  // A ragged shape's offsets: in qkv (and dqkv), in out (and dout), in the statistics.
  std::shared_ptr<TensorAttr> ragged_qkv, ragged_out, ragged_stats;
};

// Where a ragged shape's B samples start in a tensor: int32 [B + 1] (elements).
std::shared_ptr<TensorAttr> add_offsets(Graph& g, const FusedAttentionShape& s, Uid uid,
                                        const char* name) {
  return add_tensor(g, uid, name, {s.B + 1, 1, 1, 1}, {1, 1, 1, 1}, fe::DataType_t::INT32);
}

Inputs add_inputs(Graph& g, const FusedAttentionShape& s, fe::DataType_t io) {
  g.set_io_data_type(io)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  Inputs in;
  in.q = add_tensor(g, kQ, "Q", head_dims(s, s.H), packed_strides(s), io);
  in.k = add_tensor(g, kK, "K", head_dims(s, s.K), packed_strides(s), io);
  in.v = add_tensor(g, kV, "V", head_dims(s, s.K), packed_strides(s), io);
  // The key mask as a bias written out for every query: cuDNN 9.19 on an H100 misread a bias
  // broadcast over the queries ([B,1,1,T], or stride 0) in the backward, and with stride 0 in the
  // forward too.
  if (s.masked)
    in.bias = add_tensor(g, kBias, "bias", {s.B, 1, s.T, s.T}, {s.T * s.T, s.T * s.T, s.T, 1}, io);
  // A right-padded batch's mask as cuDNN's padding mask: queries per row (all T) and keys per row;
  // a ragged shape's samples' lengths the same way.
  if (s.padded || s.ragged) {
    const std::vector<int64_t> per_row{s.B, 1, 1, 1}, strides{1, 1, 1, 1};
    in.seq_len_q = add_tensor(g, kSeqLenQ, "seq_len_q", per_row, strides, fe::DataType_t::INT32);
    in.seq_len_kv = add_tensor(g, kSeqLenKV, "seq_len_kv", per_row, strides, fe::DataType_t::INT32);
  }
  if (s.ragged) {
    in.ragged_qkv = add_offsets(g, s, kRaggedQKV, "ragged_qkv");
    in.ragged_out = add_offsets(g, s, kRaggedOut, "ragged_out");
    in.ragged_stats = add_offsets(g, s, kRaggedStats, "ragged_stats");
    for (const auto& t : {in.q, in.k, in.v}) t->set_ragged_offset(in.ragged_qkv);
  }
  if (s.dropout_p > 0) {
    in.seed = add_tensor(g, kSeed, "seed", {1, 1, 1, 1}, {1, 1, 1, 1}, fe::DataType_t::INT64);
    in.offset = add_tensor(g, kOffset, "offset", {1, 1, 1, 1}, {1, 1, 1, 1}, fe::DataType_t::INT64);
  }
  return in;
}

// Sets what forward and backward attributes share: scale, causality, the mask and dropout.
template <typename Attributes>
void set_common(Attributes& a, const FusedAttentionShape& s, const Inputs& in) {
  a.set_attn_scale(s.scale).set_causal_mask(s.causal);
  if (in.bias) a.set_bias(in.bias);
  if (in.seq_len_q)
    a.set_padding_mask(true).set_seq_len_q(in.seq_len_q).set_seq_len_kv(in.seq_len_kv);
  if (in.seed) a.set_dropout(s.dropout_p, in.seed, in.offset);
}

std::vector<int64_t> stats_dims(const FusedAttentionShape& s) {
  return {s.B, s.H, s.T, 1};
}
// [B, H, T] per batch row; a ragged shape's token-major ([tokens, H], its offsets in tokens x H).
std::vector<int64_t> stats_strides(const FusedAttentionShape& s) {
  if (s.ragged) return {s.H * s.T, 1, s.H, 1};
  return {s.H * s.T, s.T, 1, 1};
}

// Gives each of `ts` the ragged offset `offset` (where the shape is ragged: it is non-null).
void set_ragged(std::initializer_list<std::shared_ptr<TensorAttr>> ts,
                const std::shared_ptr<TensorAttr>& offset) {
  if (offset)
    for (const auto& t : ts) t->set_ragged_offset(offset);
}

// A graph for a GPU of compute capability sm_version, or (0) the current GPU's, asked when the
// frontend needs it (its nodes take the graph's context as they are added).
std::shared_ptr<Graph> new_graph(int sm_version) {
  auto g = std::make_shared<Graph>();
  if (sm_version > 0) g->set_sm_version(sm_version);
  return g;
}

std::shared_ptr<Graph> forward_graph(const FusedAttentionShape& s, fe::DataType_t io,
                                     int sm_version = 0) {
  auto g = new_graph(sm_version);
  const Inputs in = add_inputs(*g, s, io);
  fe::graph::SDPA_attributes a;
  a.set_name("brisk_attention").set_generate_stats(true);
  set_common(a, s, in);
  auto [o, stats] = g->sdpa(in.q, in.k, in.v, a);
  set_output(o, kO, head_dims(s, s.H), out_strides(s));
  set_output(stats, kStats, stats_dims(s), stats_strides(s));
  stats->set_data_type(fe::DataType_t::FLOAT);
  set_ragged({o}, in.ragged_out);
  set_ragged({stats}, in.ragged_stats);
  return g;
}

std::shared_ptr<Graph> backward_graph(const FusedAttentionShape& s, fe::DataType_t io,
                                      bool deterministic, int sm_version = 0) {
  auto g = new_graph(sm_version);
  const Inputs in = add_inputs(*g, s, io);
  auto o = add_tensor(*g, kO, "O", head_dims(s, s.H), out_strides(s), io);
  auto d_o = add_tensor(*g, kDO, "dO", head_dims(s, s.H), out_strides(s), io);
  auto stats =
      add_tensor(*g, kStats, "stats", stats_dims(s), stats_strides(s), fe::DataType_t::FLOAT);
  set_ragged({o, d_o}, in.ragged_out);
  set_ragged({stats}, in.ragged_stats);
  fe::graph::SDPA_backward_attributes a;
  a.set_name("brisk_attention_backward").set_deterministic_algorithm(deterministic);
  set_common(a, s, in);
  auto [dq, dk, dv] = g->sdpa_backward(in.q, in.k, in.v, o, d_o, stats, a);
  set_output(dq, kDQ, head_dims(s, s.H), packed_strides(s));
  set_output(dk, kDK, head_dims(s, s.K), packed_strides(s));
  set_output(dv, kDV, head_dims(s, s.K), packed_strides(s));
  set_ragged({dq, dk, dv}, in.ragged_qkv);
  return g;
}

// Builds a graph's plan on `handle`; returns cuDNN's message on failure, "" on success.
std::string build(Graph& g, cudnnHandle_t handle) {
  fe::error_t st = g.build(handle, {fe::HeurMode_t::A});
  return st.is_good() ? std::string() : st.get_message();
}

struct Entry {
  FusedAttentionShape shape;
  std::shared_ptr<Graph> forward, backward;
  int64_t forward_workspace = 0, backward_workspace = 0;  // bytes, asked once when built
  std::string why_not;                                    // empty: both graphs built
};

std::mutex cache_mutex;
std::vector<std::unique_ptr<Entry>> cache;

// Why the fused attention cannot take `dtype` ("" where it can: bf16, fp16).
std::string unsupported_dtype(DType dtype) {
  if (dtype == DType::bf16 || dtype == DType::f16) return "";
  return "fused attention computes in bf16 or fp16, not " + std::string(dtype_name(dtype));
}
fe::DataType_t io_type(DType dtype) {
  return dtype == DType::bf16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF;
}

Entry make_entry(const FusedAttentionShape& s) {
  Entry e{s, nullptr, nullptr, 0, 0, ""};
  Library& lib = library();
  e.why_not = lib.ok ? unsupported_dtype(s.dtype) : lib.why;
  if (!e.why_not.empty()) return e;
  const fe::DataType_t io = io_type(s.dtype);
  try {
    e.forward = forward_graph(s, io);
    std::string why = build(*e.forward, lib.handle);
    if (why.empty()) {
      // Deterministic first (the same bits run after run), then cuDNN's fastest, unless the
      // shape asks for the fastest first (to compare the two).
      const bool first = s.deterministic_first;
      e.backward = backward_graph(s, io, first);
      why = build(*e.backward, lib.handle);
      if (!why.empty()) {
        e.backward = backward_graph(s, io, !first);
        why = build(*e.backward, lib.handle);
      }
    }
    e.why_not = why;
  } catch (const std::exception& ex) {
    e.why_not = ex.what();
  }
  if (e.why_not.empty() && (!e.forward || !e.backward)) e.why_not = "no graph";
  if (e.why_not.empty() && (!e.forward->get_workspace_size(e.forward_workspace).is_good() ||
                            !e.backward->get_workspace_size(e.backward_workspace).is_good()))
    e.why_not = "cuDNN gave no workspace size";
  return e;
}

const Entry& entry(const FusedAttentionShape& s) {
  std::lock_guard<std::mutex> lock(cache_mutex);
  for (const auto& e : cache)
    if (e->shape == s) return *e;
  cache.push_back(std::make_unique<Entry>(make_entry(s)));
  return *cache.back();
}

const Entry& supported_entry(const FusedAttentionShape& s, const char* op) {
  const Entry& e = entry(s);
  BRISK_CHECK(e.why_not.empty(), op, ": cuDNN's fused attention is not available: ", e.why_not);
  return e;
}

void execute(cudaStream_t stream, const Graph& g, int64_t need,
             std::unordered_map<int64_t, void*>& ptrs, const FusedAttentionArgs& a,
             const char* op) {
  BRISK_CHECK(need <= a.workspace_bytes, op, ": cuDNN's attention needs ", need,
              " bytes of workspace, the plan gave ", a.workspace_bytes);
  cudnnHandle_t handle = library().handle;
  BRISK_CHECK(fe::detail::set_stream(handle, stream) == CUDNN_STATUS_SUCCESS, op,
              ": cudnnSetStream failed");
  fe::error_t st = g.execute(handle, ptrs, a.workspace);
  BRISK_CHECK(st.is_good(), op, ": cuDNN: ", st.get_message());
}

// Maps the inputs forward and backward share: q, k and v inside packed qkv, the mask, seed, offset.
std::unordered_map<int64_t, void*> input_pointers(const FusedAttentionShape& s,
                                                  const FusedAttentionArgs& a, void* qkv) {
  const int64_t width = static_cast<int64_t>(dtype_size(s.dtype));
  char* base = static_cast<char*>(qkv);
  std::unordered_map<int64_t, void*> p{
      {kQ, base}, {kK, base + s.H * s.D * width}, {kV, base + (s.H + s.K) * s.D * width}};
  if (s.masked) p[kBias] = const_cast<void*>(a.bias);
  if (s.padded || s.ragged) {
    p[kSeqLenQ] = const_cast<int32_t*>(a.seq_len_q);
    p[kSeqLenKV] = const_cast<int32_t*>(s.ragged ? a.seq_len_q : a.seq_len_kv);
  }
  if (s.ragged) {
    p[kRaggedQKV] = const_cast<int32_t*>(a.ragged_qkv);
    p[kRaggedOut] = const_cast<int32_t*>(a.ragged_out);
    p[kRaggedStats] = const_cast<int32_t*>(a.ragged_stats);
  }
  if (s.dropout_p > 0) {
    p[kSeed] = const_cast<int64_t*>(a.seed_offset);
    p[kOffset] = const_cast<int64_t*>(a.seed_offset + 1);
  }
  return p;
}

}  // namespace

bool fused_attention_supported(const FusedAttentionShape& shape, std::string* why_not,
                               int64_t* workspace) {
  const Entry& e = entry(shape);
  if (why_not) *why_not = e.why_not;
  if (workspace) *workspace = std::max(e.forward_workspace, e.backward_workspace);
  return e.why_not.empty();
}

int64_t fused_attention_workspace(const FusedAttentionShape& shape, bool backward) {
  const Entry& e = supported_entry(shape, "fused attention");
  return backward ? e.backward_workspace : e.forward_workspace;
}

void fused_attention_forward(cudaStream_t s, const FusedAttentionShape& shape,
                             const FusedAttentionArgs& a) {
  const Entry& e = supported_entry(shape, "attention_forward");
  auto ptrs = input_pointers(shape, a, const_cast<void*>(a.qkv));
  ptrs[kO] = a.out;
  ptrs[kStats] = a.stats;
  execute(s, *e.forward, e.forward_workspace, ptrs, a, "attention_forward");
}

void fused_attention_backward(cudaStream_t s, const FusedAttentionShape& shape,
                              const FusedAttentionArgs& a) {
  const Entry& e = supported_entry(shape, "attention_backward");
  auto ptrs = input_pointers(shape, a, const_cast<void*>(a.qkv));
  const int64_t width = static_cast<int64_t>(dtype_size(shape.dtype));
  char* d = static_cast<char*>(a.dqkv);
  ptrs[kO] = a.out;
  ptrs[kStats] = a.stats;
  ptrs[kDO] = const_cast<void*>(a.dout);
  ptrs[kDQ] = d;
  ptrs[kDK] = d + shape.H * shape.D * width;
  ptrs[kDV] = d + (shape.H + shape.K) * shape.D * width;
  execute(s, *e.backward, e.backward_workspace, ptrs, a, "attention_backward");
}

bool cudnn_available(std::string* why_not) {
  const Library& lib = library();
  if (why_not) *why_not = lib.why;
  return lib.ok;
}

bool cudnn_loadable(std::string* why_not) {
  const Library& lib = library();
  if (why_not) *why_not = lib.loaded ? "" : lib.why;
  return lib.loaded;
}

bool fused_attention_graphs_valid(const FusedAttentionShape& shape, int sm_version,
                                  std::string* why_not) {
  const Library& lib = library();
  std::string why = lib.loaded ? unsupported_dtype(shape.dtype) : lib.why;
  if (why.empty()) try {
      const fe::DataType_t io = io_type(shape.dtype);
      fe::error_t forward = forward_graph(shape, io, sm_version)->validate();
      fe::error_t backward = backward_graph(shape, io, true, sm_version)->validate();
      if (!forward.is_good()) why = "the forward graph: " + forward.get_message();
      if (forward.is_good() && !backward.is_good())
        why = "the backward graph: " + backward.get_message();
    } catch (const std::exception& e) {
      why = e.what();
    }
  if (why_not) *why_not = why;
  return why.empty();
}

bool cudnn_opened() {
  return cudnn_frontend::cudnn_dlhandle != nullptr;
}

#else  // no cudnn-frontend headers at build time

bool fused_attention_supported(const FusedAttentionShape&, std::string* why_not, int64_t*) {
  if (why_not) *why_not = "this brisk was built without the cudnn-frontend headers";
  return false;
}
int64_t fused_attention_workspace(const FusedAttentionShape&, bool) {
  BRISK_FAIL("fused attention: this brisk was built without the cudnn-frontend headers");
}
void fused_attention_forward(cudaStream_t, const FusedAttentionShape&, const FusedAttentionArgs&) {
  BRISK_FAIL("attention_forward: this brisk was built without the cudnn-frontend headers");
}
void fused_attention_backward(cudaStream_t, const FusedAttentionShape&, const FusedAttentionArgs&) {
  BRISK_FAIL("attention_backward: this brisk was built without the cudnn-frontend headers");
}
bool cudnn_available(std::string* why_not) {
  if (why_not) *why_not = "this brisk was built without the cudnn-frontend headers";
  return false;
}
bool cudnn_loadable(std::string* why_not) {
  return cudnn_available(why_not);
}
bool fused_attention_graphs_valid(const FusedAttentionShape&, int, std::string* why_not) {
  return cudnn_available(why_not);
}
bool cudnn_opened() {
  return false;
}

#endif

}  // namespace brisk::cuda
