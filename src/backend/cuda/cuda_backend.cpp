// CudaBackend: construction, transfers, and the ops that map onto one kernel launcher each
// (cuda_kernels.h). Shapes and dtypes are checked here, on the host, before anything is enqueued.
#include "backend/cuda/cuda_backend.h"

#include <cmath>
#include <vector>

#include "backend/cuda/cublaslt_api.h"
#include "backend/cuda/cuda_checks.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_launch.h"
#include "core/step_control.h"

namespace brisk {

static_assert(cuda::kAdafactorScratch == kAdafactorScratch, "the planned scratch fits the kernels");

namespace {
using cuda::check_cuda;
using cuda::check_mask_on_device;
using cuda::check_rounding;
using cuda::dev;
using cuda::dev_i32;
using cuda::dev_or_null;
using cuda::ids_or_null;

void same_numel(const Tensor& a, const Tensor& b, const char* op) {
  BRISK_CHECK(a.numel() == b.numel(), op, ": element counts differ (", a.shape().str(), " vs ",
              b.shape().str(), ")");
}
int64_t cols(const Tensor& t) {
  return t.rank() ? t.dim(-1) : 1;
}
int64_t rows(const Tensor& t) {
  return cols(t) ? t.numel() / cols(t) : 0;
}
// A tensor of `dtype` in device memory, as T.
template <typename T>
T* dev_as(const Tensor& t, DType dtype, const char* what) {
  BRISK_CHECK(t.device() == Device::cuda, what, " is not in GPU memory");
  BRISK_CHECK(t.dtype() == dtype, what, " must be ", dtype_name(dtype), ", got ",
              dtype_name(t.dtype()));
  return t.as<T>();
}
const int64_t* decay_ranges(const Tensor& ranges, const char* op) {
  BRISK_CHECK(ranges.dtype() == DType::i64 && ranges.rank() == 2 && ranges.dim(1) == 2 &&
                  ranges.device() == Device::cuda,
              op, ": decay ranges must be int64 [R,2] in GPU memory");
  return ranges.as<int64_t>();
}
// The step size and bias correction of AdamW step `step`, in double on the host as the CPU.
cuda::AdamWArgs adamw_args(float lr, float beta1, float beta2, float eps, float weight_decay,
                           int64_t step) {
  const double bc1 = 1.0 - std::pow(static_cast<double>(beta1), static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(static_cast<double>(beta2), static_cast<double>(step));
  return {lr,
          beta1,
          beta2,
          eps,
          weight_decay,
          static_cast<float>(lr / bc1),
          static_cast<float>(std::sqrt(bc2))};
}
}  // namespace

CudaBackend::CudaBackend(const Switches& switches) : switches_(switches) {
  check_cuda(cudaGetDevice(&device_index_), "cudaGetDevice");
  check_cuda(cudaGetDeviceProperties(&props_, device_index_), "cudaGetDeviceProperties");
  BRISK_CHECK(props_.major >= 8, "--device cuda: ", props_.name, " (compute capability ",
              props_.major, ".", props_.minor, ") is older than Ampere (8.0), which brisk needs");
  check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  check_cuda(cudaEventCreateWithFlags(&uploaded_, cudaEventDisableTiming), "cudaEventCreate");
  const cublasStatus_t st = cublaslt().Create(&lt_);
  BRISK_CHECK(st == CUBLAS_STATUS_SUCCESS, "cublasLtCreate failed (status ", static_cast<int>(st),
              ")");
}

CudaBackend::~CudaBackend() {
  plans_.clear();
  if (lt_) cublaslt().Destroy(lt_);
  if (uploaded_) cudaEventDestroy(uploaded_);
  if (stream_) {
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
  }
}

std::string CudaBackend::name() const {
  return std::string("cuda (") + props_.name + ")";
}

int64_t CudaBackend::device_memory_used() const {
  return nvml_memory_used(device_index_);
}

void CudaBackend::upload(const Tensor& src, const Tensor& dst) {
  BRISK_CHECK(src.bytes() == dst.bytes(), "upload: sizes differ (", src.bytes(), " vs ",
              dst.bytes(), " bytes)");
  BRISK_CHECK(src.device() == Device::cpu && dst.device() == Device::cuda,
              "upload: expects host to GPU memory");
  if (src.bytes() == 0) return;
  // From page-locked staging memory this copy runs asynchronously on the compute stream.
  check_cuda(cudaMemcpyAsync(dst.data(), src.data(), src.bytes(), cudaMemcpyHostToDevice, stream_),
             "host-to-device copy");
  check_cuda(cudaEventRecord(uploaded_, stream_), "cudaEventRecord");
}

void CudaBackend::wait_for_uploads() {
  // The copy is queued behind the previous micro-step's kernels: waiting for it keeps one
  // micro-step of work queued on the GPU while the host prepares the next batch.
  check_cuda(cudaEventSynchronize(uploaded_), "waiting for uploads");
}

void CudaBackend::download(const Tensor& src, const Tensor& dst) {
  BRISK_CHECK(src.bytes() == dst.bytes(), "download: sizes differ (", src.bytes(), " vs ",
              dst.bytes(), " bytes)");
  BRISK_CHECK(src.device() == Device::cuda && dst.device() == Device::cpu,
              "download: expects GPU to host memory");
  if (src.bytes() > 0)
    check_cuda(
        cudaMemcpyAsync(dst.data(), src.data(), src.bytes(), cudaMemcpyDeviceToHost, stream_),
        "device-to-host copy");
  synchronize();
}

void CudaBackend::synchronize() {
  check_cuda(cudaStreamSynchronize(stream_), "a GPU operation");
}

namespace {

// An instantiated graph, launched on the stream it was captured from.
class CudaGraph final : public RecordedWork {
 public:
  CudaGraph(cudaGraphExec_t exec, cudaStream_t stream) : exec_(exec), stream_(stream) {}
  ~CudaGraph() override { cudaGraphExecDestroy(exec_); }
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;
  void run() override { check_cuda(cudaGraphLaunch(exec_, stream_), "launching a recorded step"); }

 private:
  cudaGraphExec_t exec_;
  cudaStream_t stream_;
};

}  // namespace

std::unique_ptr<RecordedWork> CudaBackend::record(const std::function<void()>& work) {
  // Thread-local: this thread's calls that would wait for the device fail the capture.
  check_cuda(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal),
             "starting to record a step");
  cudaGraph_t graph = nullptr;
  try {
    work();
  } catch (const std::exception& e) {
    cudaStreamEndCapture(stream_, &graph);
    if (graph) cudaGraphDestroy(graph);
    cudaGetLastError();  // the capture's own error is the one reported
    BRISK_FAIL(e.what(), " (while recording a step as a CUDA graph: BRISK_RECORDED_STEPS=1)");
  }
  check_cuda(cudaStreamEndCapture(stream_, &graph),
             "recording a step as a CUDA graph (BRISK_RECORDED_STEPS=1)");
  cudaGraphExec_t exec = nullptr;
  const cudaError_t made = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  check_cuda(made, "instantiating a recorded step");
  return std::make_unique<CudaGraph>(exec, stream_);
}

// ---- 16-bit activations ----

bool CudaBackend::bf16_activations(DType dtype) const {
  return switches_.bf16_activations && dtype == DType::bf16 && matmul_dtype_ == DType::bf16;
}

cuda::In CudaBackend::dev_in(const Tensor& t, const char* what) const {
  BRISK_CHECK(t.device() == Device::cuda, what, " is not in GPU memory");
  const bool bf16 = t.dtype() == DType::bf16 && bf16_activations(DType::bf16);
  BRISK_CHECK(t.dtype() == DType::f32 || bf16, what, " must be float32",
              bf16_activations(DType::bf16) ? " or bf16" : "", ", got ", dtype_name(t.dtype()));
  return {t.data(), bf16};
}

cuda::Out CudaBackend::dev_out(const Tensor& t, const char* what) const {
  const cuda::In in = dev_in(t, what);
  return {t.data(), in.bf16};
}

// ---- normalization ----

void CudaBackend::layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                    float eps, const Tensor& y, const Tensor& mean,
                                    const Tensor& rstd) {
  const int64_t C = cols(x), R = rows(x);
  BRISK_CHECK(gamma.numel() == C && beta.numel() == C, "layernorm_forward: gamma/beta size");
  same_numel(x, y, "layernorm_forward");
  BRISK_CHECK(mean.numel() == R && rstd.numel() == R, "layernorm_forward: statistics size");
  cuda::layernorm_forward(stream_, dev(x, "layernorm input"), dev(gamma, "gamma"),
                          dev(beta, "beta"), eps, dev_out(y, "layernorm output"), dev(mean, "mean"),
                          dev(rstd, "rstd"), R, C);
}

cuda::ColumnScratch CudaBackend::column_scratch() {
  const Tensor& ws = ws_.matmul_workspace;
  return {ws.empty() ? nullptr : static_cast<float*>(ws.data()),
          static_cast<int64_t>(ws.bytes() / sizeof(float)), props_.multiProcessorCount};
}

void CudaBackend::layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma,
                                     const Tensor& mean, const Tensor& rstd, const Tensor& dx,
                                     bool accumulate_dx, const Tensor& dgamma,
                                     const Tensor& dbeta) {
  const int64_t C = cols(x), R = rows(x);
  same_numel(dy, x, "layernorm_backward");
  same_numel(dx, x, "layernorm_backward dx");
  BRISK_CHECK(mean.numel() == R && rstd.numel() == R, "layernorm_backward: statistics size");
  cuda::layernorm_backward(stream_, dev(dy, "layernorm gradient"), dev(x, "layernorm input"),
                           dev(gamma, "gamma"), dev(mean, "mean"), dev(rstd, "rstd"),
                           dev(dx, "layernorm dx"), accumulate_dx, dev_or_null(dgamma, "dgamma"),
                           dev_or_null(dbeta, "dbeta"), R, C, column_scratch(), DType::f32, {});
}

void CudaBackend::rmsnorm_forward(const Tensor& x, const Tensor& gamma, float eps, const Tensor& y,
                                  const Tensor& rstd) {
  check_rmsnorm(x, gamma, rstd, y, "rmsnorm_forward", bf16_activations(y.dtype()));
  cuda::rmsnorm_forward(stream_, dev(x, "rmsnorm input"), dev(gamma, "gamma"), eps,
                        dev_out(y, "rmsnorm output"), dev(rstd, "rstd"), rows(x), cols(x));
}

void CudaBackend::rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma,
                                   const Tensor& rstd, const Tensor& dx, bool accumulate_dx,
                                   const Tensor& dgamma) {
  check_rmsnorm(x, gamma, rstd, dy, "rmsnorm_backward");
  check_rmsnorm(x, gamma, rstd, dx, "rmsnorm_backward");
  if (!dgamma.empty()) check_rmsnorm(x, dgamma, rstd, dy, "rmsnorm_backward dgamma");
  cuda::rmsnorm_backward(stream_, dev(dy, "rmsnorm gradient"), dev(x, "rmsnorm input"),
                         dev(gamma, "gamma"), dev(rstd, "rstd"), dev(dx, "rmsnorm dx"),
                         accumulate_dx, dev_or_null(dgamma, "dgamma"), rows(x), cols(x),
                         column_scratch(), DType::f32, {});
}

// One pass: the rounding of dy as the kernels read it, the branch's dropout after each row's dx.
void CudaBackend::norm_backward(const Tensor& dy, const Tensor& x, const Norm& n, const Tensor& dx,
                                bool accumulate_dx, const Tensor& dgamma, const Tensor& dbeta,
                                DType round_dy, const BranchDropout& branch) {
  check_norm(x, n, dy, "norm_backward", false);
  check_rounding(round_dy, "norm_backward");
  check_norm(x, n, dx, "norm_backward dx", false);
  BRISK_CHECK(!n.rms || dbeta.empty(), "norm_backward: an RMSNorm has no beta");
  for (const Tensor* t : {&dgamma, &dbeta})
    BRISK_CHECK(t->empty() || t->numel() == n.gamma.numel(),
                "norm_backward: parameter gradient size");
  BRISK_CHECK(branch.grad.empty() || branch.grad.numel() == dx.numel(),
              "norm_backward: the branch's gradient is not shaped as dx");
  BRISK_CHECK(branch.p >= 0.0f && branch.p < 1.0f, "dropout probability ", branch.p,
              " is outside [0, 1)");
  const cuda::BranchGrad b{dev_or_null(branch.grad, "the branch's gradient"), branch.p, branch.key};
  const float *g = dev(dy, "norm gradient"), *in = dev(x, "norm input");
  if (n.rms)
    cuda::rmsnorm_backward(stream_, g, in, dev(n.gamma, "gamma"), dev(n.rstd, "rstd"),
                           dev(dx, "norm dx"), accumulate_dx, dev_or_null(dgamma, "dgamma"),
                           rows(x), cols(x), column_scratch(), round_dy, b);
  else
    cuda::layernorm_backward(stream_, g, in, dev(n.gamma, "gamma"), dev(n.mean, "mean"),
                             dev(n.rstd, "rstd"), dev(dx, "norm dx"), accumulate_dx,
                             dev_or_null(dgamma, "dgamma"), dev_or_null(dbeta, "dbeta"), rows(x),
                             cols(x), column_scratch(), round_dy, b);
}

// ---- rotary position embedding ----

void CudaBackend::rotary_forward(const Tensor& qkv, int heads, int kv_heads, const Tensor& cos,
                                 const Tensor& sin, int64_t first_position,
                                 const Tensor& positions) {
  const RotaryDims d =
      check_rotary(qkv, heads, kv_heads, cos, sin, first_position, positions, "rotary_forward");
  cuda::rotary(stream_, dev(qkv, "qkv"), dev(cos, "rotary cos table"), dev(sin, "rotary sin table"),
               d.B, d.T, d.H, d.K, d.D, first_position, ids_or_null(positions, "positions"), false);
}

void CudaBackend::rotary_backward(const Tensor& dqkv, int heads, int kv_heads, const Tensor& cos,
                                  const Tensor& sin, int64_t first_position,
                                  const Tensor& positions) {
  const RotaryDims d =
      check_rotary(dqkv, heads, kv_heads, cos, sin, first_position, positions, "rotary_backward");
  cuda::rotary(stream_, dev(dqkv, "dqkv"), dev(cos, "rotary cos table"),
               dev(sin, "rotary sin table"), d.B, d.T, d.H, d.K, d.D, first_position,
               ids_or_null(positions, "positions"), true);
}

// ---- elementwise ----

void CudaBackend::activation_forward(Activation kind, const Tensor& x, const Tensor& y) {
  same_numel(x, y, "activation_forward");
  cuda::activation_forward(stream_, kind, dev_in(x, "activation input"),
                           dev_out(y, "activation output"), x.numel());
}

void CudaBackend::activation_backward(Activation kind, const Tensor& x, const Tensor& dy,
                                      const Tensor& dx, DType round_dy) {
  same_numel(x, dy, "activation_backward");
  same_numel(x, dx, "activation_backward");
  check_rounding(round_dy, "activation_backward");
  cuda::activation_backward(stream_, kind, dev_in(x, "activation input"),
                            cuda::f32_in(dev(dy, "activation gradient")), round_dy,
                            cuda::f32_out(dev(dx, "activation dx")), x.numel());
}

void CudaBackend::swiglu_forward(const Tensor& gate_up, const Tensor& out) {
  const int64_t F = check_swiglu(gate_up, out, "swiglu_forward", bf16_activations(DType::bf16));
  cuda::swiglu_forward(stream_, dev_in(gate_up, "swiglu input"), dev_out(out, "swiglu output"),
                       rows(out), F);
}

void CudaBackend::swiglu_backward(const Tensor& gate_up, const Tensor& dout, const Tensor& dgate_up,
                                  DType round_dout) {
  const int64_t F = check_swiglu(gate_up, dout, "swiglu_backward", bf16_activations(DType::bf16));
  same_numel(gate_up, dgate_up, "swiglu_backward dgate_up");
  check_rounding(round_dout, "swiglu_backward");
  cuda::swiglu_backward(stream_, dev_in(gate_up, "swiglu input"), dev(dout, "swiglu gradient"),
                        round_dout, dev_out(dgate_up, "swiglu dgate_up"), rows(dout), F);
}

void CudaBackend::tanh_forward(const Tensor& x, const Tensor& y) {
  same_numel(x, y, "tanh_forward");
  cuda::tanh_forward(stream_, dev(x, "tanh input"), dev(y, "tanh output"), x.numel());
}

void CudaBackend::tanh_backward(const Tensor& y, const Tensor& dy, const Tensor& dx) {
  same_numel(y, dy, "tanh_backward");
  same_numel(y, dx, "tanh_backward");
  cuda::tanh_backward(stream_, dev(y, "tanh output"), dev(dy, "tanh gradient"), dev(dx, "tanh dx"),
                      y.numel());
}

void CudaBackend::dropout_forward(const Tensor& x, float p, const RngKey& key, const Tensor& y) {
  same_numel(x, y, "dropout_forward");
  cuda::dropout(stream_, cuda::f32_in(dev(x, "dropout input")), nullptr, p, key,
                dev(y, "dropout output"), x.numel());
}

void CudaBackend::dropout_backward(const Tensor& dy, float p, const RngKey& key, const Tensor& dx) {
  same_numel(dy, dx, "dropout_backward");
  cuda::dropout(stream_, cuda::f32_in(dev(dy, "dropout gradient")), nullptr, p, key,
                dev(dx, "dropout dx"), dy.numel());
}

void CudaBackend::dropout_add(const Tensor& x, const Tensor& r, float p, const RngKey& key,
                              const Tensor& y) {
  same_numel(x, r, "dropout_add");
  same_numel(x, y, "dropout_add");
  cuda::dropout(stream_, dev_in(r, "dropout_add input"), dev(x, "dropout_add residual"), p, key,
                dev(y, "dropout_add output"), x.numel());
}

void CudaBackend::dropout_add_norm(const Tensor& x, const Tensor& r, float p, const RngKey& key,
                                   const Tensor& sum, const Norm& norm, const Tensor& y) {
  same_numel(x, r, "dropout_add_norm");
  check_norm(x, norm, sum, "dropout_add_norm", false);
  check_norm(x, norm, y, "dropout_add_norm", bf16_activations(y.dtype()));
  cuda::dropout_add_norm(
      stream_, dev(x, "dropout_add_norm residual"), dev_in(r, "dropout_add_norm input"), p, key,
      dev(sum, "dropout_add_norm sum"), dev(norm.gamma, "gamma"),
      norm.rms ? nullptr : dev(norm.beta, "beta"), norm.eps, dev_out(y, "dropout_add_norm output"),
      norm.rms ? nullptr : dev(norm.mean, "mean"), dev(norm.rstd, "rstd"), rows(x), cols(x));
}

void CudaBackend::add_inplace(const Tensor& y, const Tensor& x) {
  same_numel(x, y, "add_inplace");
  cuda::add_inplace(stream_, dev(y, "add_inplace target"), dev(x, "add_inplace source"), x.numel());
}

void CudaBackend::fill(const Tensor& t, float value) {
  cuda::fill(stream_, dev(t, "fill target"), value, t.numel());
}

void CudaBackend::copy_rows(const Tensor& src, const Tensor& dst, const RowCopy& c) {
  const auto bytes = static_cast<size_t>(check_copy_rows(src, dst, c));
  BRISK_CHECK(src.device() == Device::cuda && dst.device() == Device::cuda,
              "copy_rows: both tensors must be in GPU memory");
  if (c.rows == 0 || c.count == 0) return;
  const auto* from = static_cast<const char*>(src.data()) + static_cast<size_t>(c.src_at) * bytes;
  auto* to = static_cast<char*>(dst.data()) + static_cast<size_t>(c.dst_at) * bytes;
  // One run: the pitches do not matter (cudaMemcpy2D wants them at least the width).
  const size_t width = static_cast<size_t>(c.count) * bytes;
  const size_t src_pitch = c.rows == 1 ? width : static_cast<size_t>(c.src_pitch) * bytes;
  const size_t dst_pitch = c.rows == 1 ? width : static_cast<size_t>(c.dst_pitch) * bytes;
  check_cuda(cudaMemcpy2DAsync(to, dst_pitch, from, src_pitch, width, static_cast<size_t>(c.rows),
                               cudaMemcpyDeviceToDevice, stream_),
             "strided device copy");
}

void CudaBackend::copy(const Tensor& src, const Tensor& dst) {
  BRISK_CHECK(src.dtype() == dst.dtype(), "copy: dtypes differ");
  same_numel(src, dst, "copy");
  BRISK_CHECK(src.device() == Device::cuda && dst.device() == Device::cuda,
              "copy: both tensors must be in GPU memory");
  if (src.data() != dst.data() && src.bytes() > 0)
    check_cuda(
        cudaMemcpyAsync(dst.data(), src.data(), src.bytes(), cudaMemcpyDeviceToDevice, stream_),
        "device copy");
}

void CudaBackend::cast(const Tensor& src, const Tensor& dst) {
  same_numel(src, dst, "cast");
  BRISK_CHECK(src.device() == Device::cuda && dst.device() == Device::cuda,
              "cast: both tensors must be in GPU memory");
  cuda::cast(stream_, src.data(), src.dtype(), dst.data(), dst.dtype(), src.numel());
}

void CudaBackend::round_to(DType dtype, const Tensor& src, const Tensor& dst) {
  same_numel(src, dst, "round_to");
  if (dtype == DType::f32) return copy(src, dst);
  BRISK_CHECK(dtype == DType::bf16 || dtype == DType::f16, "round_to: cannot round to ",
              dtype_name(dtype));
  cuda::round_to(stream_, dtype, dev(src, "round_to input"), dev(dst, "round_to output"),
                 src.numel());
}

void CudaBackend::stochastic_round(DType dtype, const Tensor& t, const RngKey& key) {
  BRISK_CHECK(dtype == DType::bf16, "stochastic_round: only bf16 is supported, not ",
              dtype_name(dtype));
  cuda::stochastic_round(stream_, dev(t, "stochastic_round tensor"), t.numel(), key);
}

// ---- embeddings and heads ----

void CudaBackend::embedding_forward(const Tensor& ids, const Tensor& word, const Tensor& pos,
                                    const Tensor& type_ids, const Tensor& type_table,
                                    const Tensor& out, const VocabShard& shard,
                                    const Tensor& positions) {
  BRISK_CHECK(ids.rank() == 2, "embedding_forward: ids must be [B,T]");
  const int64_t B = ids.dim(0), T = ids.dim(1), C = cols(word);
  expect(out, DType::f32, Shape{B, T, C}, "embedding_forward output");
  check_token_positions(positions, B * T, Device::cuda, "embedding_forward");
  BRISK_CHECK(pos.empty() || !positions.empty() || pos.dim(0) >= T, "embedding_forward: ", T,
              " positions exceed the position table");
  cuda::embedding_forward(stream_, ids_or_null(ids, "ids"), dev(word, "word table"),
                          dev_or_null(pos, "position table"), ids_or_null(type_ids, "type ids"),
                          dev_or_null(type_table, "type table"), dev(out, "embedding output"), B, T,
                          C, shard.first, shard.count(word.dim(0)),
                          ids_or_null(positions, "positions"));
}

void CudaBackend::embedding_backward(const Tensor& dout, const Tensor& ids, int64_t padding_idx,
                                     const Tensor& type_ids, const Tensor& dword,
                                     const Tensor& dpos, const Tensor& dtype_table,
                                     const VocabShard& shard, const Tensor& positions) {
  BRISK_CHECK(ids.rank() == 2, "embedding_backward: ids must be [B,T]");
  const int64_t B = ids.dim(0), T = ids.dim(1), C = cols(dout);
  expect(dout, DType::f32, Shape{B, T, C}, "embedding_backward gradient");
  check_token_positions(positions, B * T, Device::cuda, "embedding_backward");
  if (!dword.empty())
    check_padding_idx(padding_idx, shard.vocab == 0 ? dword.dim(0) : shard.vocab,
                      "embedding_backward");
  cuda::embedding_backward(
      stream_, dev(dout, "embedding gradient"), ids_or_null(ids, "ids"), padding_idx,
      ids_or_null(type_ids, "type ids"), dev_or_null(dword, "dword"), dev_or_null(dpos, "dpos"),
      dev_or_null(dtype_table, "dtype_table"), B, T, C, shard.first,
      dword.empty() ? 0 : shard.count(dword.dim(0)), ids_or_null(positions, "positions"));
}

namespace {
// The samples whose first tokens a pooling reads: B, or a packed batch's (starts [samples + 1]).
int64_t pooled_samples(const Tensor& x, const Tensor& starts, const char* op) {
  if (starts.empty()) return x.dim(0);
  BRISK_CHECK(starts.dtype() == DType::i32 && starts.numel() >= 2 &&
                  starts.numel() <= x.dim(0) + 1 && starts.device() == Device::cuda,
              op, ": starts must be int32 [samples + 1] in GPU memory, of at most ", x.dim(0),
              " samples, got ", starts.shape().str());
  return starts.numel() - 1;
}
}  // namespace

void CudaBackend::first_token(const Tensor& x, const Tensor& out, const Tensor& starts) {
  const int64_t B = x.dim(0), T = x.dim(1), C = x.dim(2);
  expect(out, DType::f32, Shape{B, C}, "first_token output");
  const int64_t samples = pooled_samples(x, starts, "first_token");
  cuda::first_token(stream_, dev(x, "first_token input"), dev(out, "first_token output"), B, T, C,
                    ids_or_null(starts, "starts"), samples);
}

void CudaBackend::first_token_backward(const Tensor& dout, const Tensor& dx, const Tensor& starts) {
  const int64_t B = dx.dim(0), T = dx.dim(1), C = dx.dim(2);
  expect(dout, DType::f32, Shape{B, C}, "first_token_backward gradient");
  const int64_t samples = pooled_samples(dx, starts, "first_token_backward");
  cuda::first_token_backward(stream_, dev(dout, "first_token gradient"), dev(dx, "first_token dx"),
                             B, T, C, ids_or_null(starts, "starts"), samples);
}

void CudaBackend::softmax_cross_entropy(const Tensor& logits, const Tensor& labels, bool write_grad,
                                        const GradScale& grad_scale, const Tensor& loss_sum,
                                        const Tensor& grad) {
  const int64_t V = cols(logits), N = rows(logits);
  BRISK_CHECK(labels.numel() == N, "softmax_cross_entropy: ", labels.numel(), " labels for ", N,
              " rows of logits");
  BRISK_CHECK(
      loss_sum.dtype() == DType::f64 && loss_sum.numel() == 1 && loss_sum.device() == Device::cuda,
      "softmax_cross_entropy: loss_sum must be one float64 in GPU memory");
  cuda::softmax_cross_entropy(stream_, dev(logits, "logits"), loss_grad(logits, write_grad, grad),
                              ids_or_null(labels, "labels"), N, V, write_grad, grad_scale,
                              loss_sum.as<double>());
}

// Where a loss writes its gradient: apart (check_loss_grad), or a null Out: over the logits.
cuda::Out CudaBackend::loss_grad(const Tensor& logits, bool write_grad, const Tensor& grad) const {
  if (!check_loss_grad(logits, write_grad, grad)) return {nullptr, false};
  BRISK_CHECK(grad.device() == Device::cuda, "cross-entropy: the gradient is not in GPU memory");
  return {grad.data(), grad.dtype() == DType::bf16};
}

void CudaBackend::cross_entropy_stats(const Tensor& logits, const Tensor& labels,
                                      const VocabShard& shard, const Tensor& stats) {
  const int64_t held =
      check_cross_entropy_shard(logits, labels, shard, stats, 1, "cross_entropy_stats");
  cuda::cross_entropy_stats(stream_, dev(logits, "logits"), ids_or_null(labels, "labels"),
                            rows(logits), cols(logits), shard.first, held, dev(stats, "stats"));
}

void CudaBackend::cross_entropy_from_stats(const Tensor& logits, const Tensor& labels,
                                           const VocabShard& shard, const Tensor& stats,
                                           bool write_grad, const GradScale& grad_scale,
                                           const Tensor& loss_sum, const Tensor& grad) {
  const int64_t slots = stats.rank() == 3 ? stats.dim(0) : 0;
  const int64_t held =
      check_cross_entropy_shard(logits, labels, shard, stats, slots, "cross_entropy_from_stats");
  BRISK_CHECK(
      loss_sum.dtype() == DType::f64 && loss_sum.numel() == 1 && loss_sum.device() == Device::cuda,
      "cross_entropy_from_stats: loss_sum must be one float64 in GPU memory");
  cuda::cross_entropy_from_stats(stream_, dev(logits, "logits"),
                                 loss_grad(logits, write_grad, grad), ids_or_null(labels, "labels"),
                                 rows(logits), cols(logits), shard.first, held, dev(stats, "stats"),
                                 slots, write_grad, grad_scale, loss_sum.as<double>());
}

void CudaBackend::mse_loss(const Tensor& predictions, const Tensor& targets, bool write_grad,
                           const GradScale& grad_scale, const Tensor& loss_sum) {
  const int64_t N = targets.numel();
  BRISK_CHECK(targets.dtype() == DType::f32 && predictions.dtype() == DType::f32 &&
                  predictions.numel() == N,
              "mse_loss: ", predictions.numel(), " float32 predictions for ", N,
              " float32 targets");
  BRISK_CHECK(
      loss_sum.dtype() == DType::f64 && loss_sum.numel() == 1 && loss_sum.device() == Device::cuda,
      "mse_loss: loss_sum must be one float64 in GPU memory");
  cuda::mse_loss(stream_, dev(predictions, "predictions"), dev(targets, "targets"), N, write_grad,
                 grad_scale, loss_sum.as<double>());
}

// ---- mixture of experts ----

void CudaBackend::moe_route_forward(const Tensor& logits, bool normalize, const Tensor& probs,
                                    const Tensor& weights, const Tensor& experts) {
  const auto [E, k] = check_moe_route(probs, weights, experts, "moe_route_forward");
  same_numel(logits, probs, "moe_route_forward logits");
  cuda::moe_route(stream_, dev(logits, "router logits"), probs.dim(0), E, k, normalize,
                  dev(probs, "router probabilities"), dev(weights, "routing weights"),
                  dev_i32(experts, "routed experts"));
}

void CudaBackend::moe_route_backward(const Tensor& probs, const Tensor& weights,
                                     const Tensor& experts, const Tensor& dweights,
                                     const Tensor& dprobs, bool normalize, const Tensor& dlogits) {
  const auto [E, k] = check_moe_route(probs, weights, experts, "moe_route_backward");
  same_numel(weights, dweights, "moe_route_backward dweights");
  same_numel(probs, dlogits, "moe_route_backward dlogits");
  if (!dprobs.empty()) same_numel(probs, dprobs, "moe_route_backward dprobs");
  cuda::moe_route_backward(stream_, dev(probs, "router probabilities"),
                           dev(weights, "routing weights"), dev_i32(experts, "routed experts"),
                           dev(dweights, "routing weights' gradient"),
                           dev_or_null(dprobs, "router probabilities' gradient"), probs.dim(0), E,
                           k, normalize, dev(dlogits, "router logits' gradient"));
}

void CudaBackend::moe_balance_stats(const Tensor& probs, const Tensor& experts, const Tensor& mask,
                                    const Tensor& stats) {
  const auto [N, E, k] = check_moe_balance_stats(probs, experts, mask, stats);
  cuda::moe_balance_stats(stream_, dev(probs, "router probabilities"),
                          dev_i32(experts, "routed experts"), ids_or_null(mask, "token mask"), N, E,
                          k, dev(stats, "balance statistics"));
}

void CudaBackend::moe_balance_backward(const Tensor& mask, const Tensor& scale,
                                       const Tensor& dprobs) {
  const MoeBalance b = check_moe_balance_backward(mask, scale, dprobs);
  cuda::moe_balance_backward(stream_, ids_or_null(mask, "token mask"), dev(scale, "balance scale"),
                             b.N, b.E, dev(dprobs, "router probabilities' gradient"));
}

void CudaBackend::moe_z_stats(const Tensor& logits, const Tensor& mask, const Tensor& z,
                              const Tensor& sum) {
  const MoeBalance b = check_moe_z(logits, mask, z, sum, false);
  cuda::moe_z_stats(stream_, dev(logits, "router logits"), ids_or_null(mask, "token mask"), b.N,
                    b.E, dev(z, "router z"), dev(sum, "router z-loss sum"));
}

void CudaBackend::moe_z_backward(const Tensor& probs, const Tensor& z, float scale,
                                 const Tensor& dlogits) {
  const MoeBalance b = check_moe_z(probs, Tensor(), z, dlogits, true);
  cuda::moe_z_backward(stream_, dev(probs, "router probabilities"), dev(z, "router z"), scale, b.N,
                       b.E, dev(dlogits, "router logits' gradient"));
}

void CudaBackend::moe_dispatch(const Tensor& experts, int64_t num_experts, const Tensor& counts,
                               const Tensor& positions) {
  const int64_t pairs = check_moe_dispatch(experts, num_experts, counts, positions);
  cuda::moe_dispatch(stream_, dev_i32(experts, "routed experts"), pairs, num_experts,
                     dev_i32(counts, "expert counts"), dev_i32(positions, "routed positions"));
}

void CudaBackend::moe_gather(const Tensor& x, const Tensor& positions, const Tensor& rows) {
  const auto [N, k, C] = check_moe_gather(x, positions, rows);
  cuda::moe_gather(stream_, dev(x, "moe_gather input"), dev_i32(positions, "routed positions"), N,
                   k, C, dev(rows, "routed rows"));
}

void CudaBackend::moe_combine(const Tensor& rows, const Tensor& positions, const Tensor& weights,
                              const Tensor& y, bool accumulate) {
  const auto [N, k, C] = check_moe_rows(positions, rows, y, weights, "moe_combine");
  cuda::moe_combine(stream_, dev(rows, "routed rows"), ids_or_null(positions, "routed positions"),
                    dev_or_null(weights, "routing weights"), N, k, C, accumulate,
                    dev(y, "moe_combine output"));
}

void CudaBackend::moe_combine_backward(const Tensor& dy, const Tensor& rows,
                                       const Tensor& positions, const Tensor& weights,
                                       const Tensor& drows, const Tensor& dweights) {
  const auto [N, k, C] = check_moe_combine_backward(dy, rows, positions, weights, drows, dweights);
  cuda::moe_combine_backward(
      stream_, dev(dy, "moe_combine gradient"), dev(rows, "routed rows"),
      ids_or_null(positions, "routed positions"), dev(weights, "routing weights"), N, k, C,
      dev(drows, "routed rows' gradient"), dev(dweights, "routing weights' gradient"));
}

// ---- the optimizer step ----

void CudaBackend::sum_squares(const Tensor& x, const Tensor& acc) {
  BRISK_CHECK(acc.dtype() == DType::f64 && acc.numel() == 1 && acc.device() == Device::cuda,
              "sum_squares: the accumulator must be one float64 in GPU memory");
  cuda::sum_squares(stream_, dev(x, "sum_squares input"), x.numel(), acc.as<double>());
}

void CudaBackend::decide_step(const Tensor& stats, double loss_scale, double max_norm,
                              const Tensor& control) {
  BRISK_CHECK(
      stats.dtype() == DType::f64 && stats.numel() == kStatsSize && stats.device() == Device::cuda,
      "decide_step: statistics must be float64 [", kStatsSize, "] in GPU memory");
  expect(control, DType::f32, Shape{kControlSize}, "decide_step control");
  cuda::decide_step(stream_, stats.as<double>(), loss_scale, max_norm,
                    dev(control, "step control"));
}

void CudaBackend::adamw_update(const AdamWUpdate& u) {
  const int64_t n = u.weights.numel();
  BRISK_CHECK(u.grads.numel() == n && u.exp_avg.numel() == n && u.exp_avg_sq.numel() == n,
              "adamw_update: weights, gradients and moments differ in size");
  const int64_t* ranges = decay_ranges(u.decay_ranges, "adamw_update");
  expect(u.control, DType::f32, Shape{kControlSize}, "adamw_update control");
  const cuda::AdamWArgs args = adamw_args(u.lr, u.beta1, u.beta2, u.eps, u.weight_decay, u.step);
  cuda::adamw(stream_, dev(u.weights, "weights"), dev(u.grads, "gradients"),
              dev(u.exp_avg, "exp_avg"), dev(u.exp_avg_sq, "exp_avg_sq"), n, ranges,
              static_cast<int>(u.decay_ranges.dim(0)), args, dev(u.control, "step control"));
}

void CudaBackend::sgd_update(const SgdUpdate& u) {
  const int64_t n = u.weights.numel();
  same_numel(u.weights, u.grads, "sgd_update");
  if (!u.momentum_buffer.empty()) same_numel(u.weights, u.momentum_buffer, "sgd_update");
  const int64_t* ranges = decay_ranges(u.decay_ranges, "sgd_update");
  expect(u.control, DType::f32, Shape{kControlSize}, "sgd_update control");
  const cuda::SgdArgs args{u.lr, u.momentum, u.dampening, u.weight_decay, u.nesterov, u.first_step};
  cuda::sgd(stream_, dev(u.weights, "weights"), dev(u.grads, "gradients"),
            dev_or_null(u.momentum_buffer, "the momentum buffer"), n, ranges,
            static_cast<int>(u.decay_ranges.dim(0)), args, dev(u.control, "step control"));
}

void CudaBackend::adafactor_update(const AdafactorUpdate& u) {
  const int64_t n = u.weights.numel();
  same_numel(u.weights, u.grads, "adafactor_update");
  if (!u.exp_avg.empty()) same_numel(u.weights, u.exp_avg, "adafactor_update exp_avg");
  check_param_slots(u.slots, n, "adafactor_update");
  BRISK_CHECK(!u.split || u.split->empty(),
              "adafactor_update: this backend does not step tensor ranks' shares");
  expect(u.control, DType::f32, Shape{kControlSize}, "adafactor_update control");
  BRISK_CHECK(!ws_.optimizer_scratch.empty(),
              "adafactor_update: the backend's scratch is not planned (plan_workspace)");
  // Every slot is checked before the first launch, so a bad table changes nothing.
  for (const ParamSlot& s : *u.slots) {
    const int64_t state_len = s.factored ? s.rows + s.cols : s.numel;
    BRISK_CHECK(s.state >= 0 && s.state + state_len <= u.second_moment.numel(),
                "adafactor_update: a slot's state lies outside the state buffer");
  }
  float* w = dev(u.weights, "weights");
  const float* g = dev(u.grads, "gradients");
  float* v = dev(u.second_moment, "Adafactor's second moment");
  float* m = dev_or_null(u.exp_avg, "Adafactor's exp_avg");
  const float* control = dev(u.control, "step control");
  double* scratch = ws_.optimizer_scratch.as<double>();
  const cuda::AdafactorArgs args{u.step_size,      u.beta2t, u.eps1,         u.eps2,
                                 u.clip_threshold, u.beta1,  u.weight_decay, u.scale_parameter};
  for (const ParamSlot& s : *u.slots) {
    const cuda::AdafactorTensor t{
        w + s.offset, g + s.offset, v + s.state, m ? m + s.offset : nullptr,
        s.rows,       s.cols,       s.factored,  s.decay};
    cuda::adafactor(stream_, t, args, control, scratch);
  }
}

void CudaBackend::adamw_8bit_update(const AdamW8bitUpdate& u) {
  const char* op = "adamw_8bit_update";
  const int64_t n = u.weights.numel();
  same_numel(u.weights, u.grads, op);
  check_param_slots(u.slots, n, op);
  BRISK_CHECK(!u.split || u.split->empty(), op,
              ": this backend does not step tensor ranks' shares");
  BRISK_CHECK(u.exp_avg8.numel() == u.exp_avg_sq8.numel() &&
                  u.absmax1.numel() == u.absmax2.numel() &&
                  u.exp_avg32.numel() == u.exp_avg_sq32.numel(),
              op, ": state buffers do not pair up");
  expect(u.control, DType::f32, Shape{kControlSize}, "adamw_8bit_update control");
  bool any8 = false, any32 = false;
  for (const ParamSlot& s : *u.slots) {
    if (s.blocks < 0) {
      any32 = true;
      BRISK_CHECK(s.state >= 0 && s.state + s.numel <= u.exp_avg32.numel(), op,
                  ": a slot's 32-bit state lies outside its buffer");
    } else {
      any8 = true;
      const int64_t blocks = (s.numel + kQuantBlock - 1) / kQuantBlock;
      BRISK_CHECK(s.state >= 0 && s.state + s.numel <= u.exp_avg8.numel() &&
                      s.blocks + blocks <= u.absmax1.numel(),
                  op, ": a slot's 8-bit state lies outside its buffers");
    }
  }
  float* w = dev(u.weights, "weights");
  const float* g = dev(u.grads, "gradients");
  const float* control = dev(u.control, "step control");
  // The state of a kind no slot has may be unplanned (empty); only the used kind is required.
  float *m32 = nullptr, *v32 = nullptr, *a1 = nullptr, *a2 = nullptr;
  uint8_t *c1 = nullptr, *c2 = nullptr;
  const float *qs = nullptr, *qu = nullptr;
  if (any32) {
    m32 = dev(u.exp_avg32, "exp_avg (32-bit)");
    v32 = dev(u.exp_avg_sq32, "exp_avg_sq (32-bit)");
  }
  if (any8) {
    BRISK_CHECK(u.qmap_signed.numel() == 256 && u.qmap_unsigned.numel() == 256, op,
                ": quantization maps must be float32 [256]");
    qs = dev(u.qmap_signed, "the signed quantization map");
    qu = dev(u.qmap_unsigned, "the unsigned quantization map");
    c1 = dev_as<uint8_t>(u.exp_avg8, DType::u8, "exp_avg codes");
    c2 = dev_as<uint8_t>(u.exp_avg_sq8, DType::u8, "exp_avg_sq codes");
    a1 = dev(u.absmax1, "exp_avg absmax");
    a2 = dev(u.absmax2, "exp_avg_sq absmax");
  }
  const cuda::AdamWArgs args = adamw_args(u.lr, u.beta1, u.beta2, u.eps, u.weight_decay, u.step);
  for (const ParamSlot& s : *u.slots) {
    // Computed as on the CPU, in float on the host.
    const float decay = s.decay ? 1.0f - u.lr * u.weight_decay : 1.0f;
    if (s.blocks < 0) {
      cuda::adamw_dense(stream_, w + s.offset, g + s.offset, m32 + s.state, v32 + s.state, s.numel,
                        args, decay, control);
    } else {
      cuda::adamw_8bit(stream_, w + s.offset, g + s.offset, c1 + s.state, c2 + s.state,
                       a1 + s.blocks, a2 + s.blocks, qs, qu, s.numel, args, decay, control);
    }
  }
}

}  // namespace brisk
