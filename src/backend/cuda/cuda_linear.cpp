// Matrix products on the GPU through cuBLASLt: linear layers forward (bias fused as an
// epilogue) and backward, in float32, TF32, or with 16-bit operands on tensor cores. A plan
// (descriptors and the heuristic's algorithm) is made once per shape and cached.
#include <cstring>

#include "backend/cuda/cublaslt_api.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_launch.h"

namespace brisk {

namespace {

void check_lt(cublasStatus_t st, const char* what) {
  BRISK_CHECK(st == CUBLAS_STATUS_SUCCESS, "cuBLASLt ", what, " failed (status ",
              static_cast<int>(st), ")");
}

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::bf16:
      return CUDA_R_16BF;
    case DType::f16:
      return CUDA_R_16F;
    default:
      return CUDA_R_32F;
  }
}

// A float32 tensor in GPU memory; a host tensor here would fault inside cuBLASLt instead.
float* on_gpu(const Tensor& t, const char* what) {
  BRISK_CHECK(t.device() == Device::cuda && t.dtype() == DType::f32, what,
              " must be float32 in GPU memory");
  return t.f32();
}

// A linear layer's weight: float32, or bf16 for bf16 products (hold_padded_weight's copy, whether
// or not the run reads its activations in bf16).
cuda::In weight_in(const Tensor& w, DType product) {
  if (w.dtype() == DType::bf16 && product == DType::bf16 && w.device() == Device::cuda)
    return {w.data(), true};
  return cuda::f32_in(on_gpu(w, "linear weight"));
}

// The largest power of two up to 256 dividing every given address (null pointers ignored).
int common_alignment(std::initializer_list<const void*> pointers) {
  uintptr_t bits = 256;
  for (const void* p : pointers)
    if (p) bits |= reinterpret_cast<uintptr_t>(p);
  return static_cast<int>(bits & (~bits + 1));
}

// The tail of cuBLASLt's workspace that its products never see: a bf16 output's bias cast to bf16
// there (cuBLASLt adds a bias of the output's type), 128 Ki values at most.
constexpr int64_t kBiasCopyBytes = int64_t{256} << 10;
constexpr int64_t kProductWorkspaceBytes = kCublasLtWorkspaceBytes - kBiasCopyBytes;

// A plan's epilogue: a bias of the output's type (out_type), or a mode reading or writing an
// auxiliary matrix laid out as the output (leading dimension ldc, at aux, whose address the
// heuristic reads; the call sets it again).
void set_epilogue(cublasLtMatmulDesc_t desc, cublasLtEpilogue_t epi, cudaDataType_t out_type,
                  const void* aux, int64_t ldc) {
  if (epi == CUBLASLT_EPILOGUE_DEFAULT) return;
  check_lt(cublaslt().MatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi),
           "epilogue");
  if (epi == CUBLASLT_EPILOGUE_BIAS) {
    check_lt(cublaslt().MatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &out_type,
                                               sizeof out_type),
             "bias type");
    return;
  }
  check_lt(cublaslt().MatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ldc,
                                             sizeof ldc),
           "epilogue input's leading dimension");
  check_lt(cublaslt().MatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux,
                                             sizeof aux),
           "epilogue input pointer");
}

struct LinearDims {
  int64_t m, k, n;
};
LinearDims linear_dims(const Tensor& x, const Tensor& w, WeightLayout layout, const char* op) {
  BRISK_CHECK(w.rank() == 2, op, ": weight must be 2-D, got ", w.shape().str());
  const int64_t k = x.rank() ? x.dim(-1) : 1;
  const int64_t wk = layout == WeightLayout::out_in ? w.dim(1) : w.dim(0);
  const int64_t n = layout == WeightLayout::out_in ? w.dim(0) : w.dim(1);
  BRISK_CHECK(wk == k, op, ": input width ", k, " does not match weight ", w.shape().str());
  return {k ? x.numel() / k : 0, k, n};
}
}  // namespace

CudaBackend::MatmulPlan::~MatmulPlan() {
  if (c) cublaslt().MatrixLayoutDestroy(c);
  if (b) cublaslt().MatrixLayoutDestroy(b);
  if (a) cublaslt().MatrixLayoutDestroy(a);
  if (desc) cublaslt().MatmulDescDestroy(desc);
}

void CudaBackend::set_matmul_dtype(DType dtype) {
  BRISK_CHECK(dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::f16,
              "matrix products in ", dtype_name(dtype), " are not supported");
  matmul_dtype_ = dtype;
}

void CudaBackend::plan_workspace(MemoryPlan& plan, BufferBinder& binder, MatmulOperands operands) {
  plan_backend_workspace(Device::cuda, matmul_dtype_, operands, plan, binder, ws_);
  ones_ready_ = false;
}

CudaBackend::MatmulPlan* CudaBackend::plan_for(const PlanKey& key, const void* aux) {
  auto it = plans_.find(key);
  if (it != plans_.end()) return it->second.get();
  const auto [trans_a, trans_b, m, n, k, lda, ldb, ldc, epilogue, dtype_int, tf32, align, out16] =
      key;
  const DType dtype = static_cast<DType>(dtype_int);
  // A 16-bit output (C and D) is the float32 result rounded as it is stored; its bias is of its
  // type (cuBLASLt's rule).
  const cudaDataType_t out_type = out16 ? cuda_type(dtype) : CUDA_R_32F;
  auto p = std::make_unique<MatmulPlan>();
  // Row-major C[m,n] = op(A) op(B) is column-major C^T[n,m] = op(B)^T op(A)^T: cuBLASLt's
  // first operand is our B and its second our A, each transposed exactly when ours is.
  const cublasComputeType_t compute =
      dtype == DType::f32 && tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  check_lt(cublaslt().MatmulDescCreate(&p->desc, compute, CUDA_R_32F), "matmul descriptor");
  const cublasOperation_t op_first = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_second = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  check_lt(cublaslt().MatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_first,
                                             sizeof op_first),
           "transpose attribute");
  check_lt(cublaslt().MatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_second,
                                             sizeof op_second),
           "transpose attribute");
  const auto epi = static_cast<cublasLtEpilogue_t>(epilogue);
  set_epilogue(p->desc, epi, out_type, aux, ldc);
  const cudaDataType_t in = cuda_type(dtype);
  // Stored (pre-op) shapes in column-major terms.
  check_lt(cublaslt().MatrixLayoutCreate(&p->a, in, trans_b ? k : n, trans_b ? n : k, ldb),
           "layout of B");
  check_lt(cublaslt().MatrixLayoutCreate(&p->b, in, trans_a ? m : k, trans_a ? k : m, lda),
           "layout of A");
  check_lt(cublaslt().MatrixLayoutCreate(&p->c, out_type, n, m, ldc), "layout of C");
  cublasLtMatmulPreference_t pref = nullptr;
  check_lt(cublaslt().MatmulPreferenceCreate(&pref), "preference");
  const size_t ws = kProductWorkspaceBytes;
  cublaslt().MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                          sizeof ws);
  const uint32_t min_align = static_cast<uint32_t>(align);
  for (auto attr :
       {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
    cublaslt().MatmulPreferenceSetAttribute(pref, attr, &min_align, sizeof min_align);
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t st = cublaslt().MatmulAlgoGetHeuristic(lt_, p->desc, p->a, p->b, p->c, p->c,
                                                              pref, 1, &result, &found);
  cublaslt().MatmulPreferenceDestroy(pref);
  const bool extra = epi != CUBLASLT_EPILOGUE_DEFAULT && epi != CUBLASLT_EPILOGUE_BIAS;
  if (extra && (st != CUBLAS_STATUS_SUCCESS || found == 0)) p.reset();  // the caller's fallback
  BRISK_CHECK(extra || (st == CUBLAS_STATUS_SUCCESS && found > 0),
              "cuBLASLt has no algorithm for a ", m, " x ", k, " x ", n, " ", dtype_name(dtype),
              " product (status ", static_cast<int>(st), ")");
  if (p) p->algo = result.algo;
  return plans_.emplace(key, std::move(p)).first->second.get();
}

namespace {
// An operand of a 16-bit product as it lies where it is stored in bf16 (`dtype` is then bf16:
// bf16_activations), else its float32 values (16-bit ones in float32 containers, as on the CPU)
// packed into `buffer` for the tensor cores.
const void* packed(cudaStream_t stream, cuda::In x, int64_t n, DType dtype, const Tensor& buffer) {
  if (x.bf16) return x.data;
  BRISK_CHECK(!buffer.empty() && n <= buffer.numel(),
              "16-bit matrix products need the backend's operand buffers in the plan");
  cuda::cast(stream, x.data, DType::f32, buffer.data(), dtype, n);
  return buffer.data();
}
}  // namespace

// A bf16 output's bias, cast to bf16 into the workspace's tail (kBiasCopyBytes): the same sum as
// the float32 bias where its values are bf16 ones (a 16-bit compute copy's).
const void* CudaBackend::bias_operand(const float* bias, int64_t n) {
  BRISK_CHECK(n <= kBiasCopyBytes / 2, "linear_forward: a bias of ", n,
              " values is wider than a bf16 output's bias may be (", kBiasCopyBytes / 2, ")");
  BRISK_CHECK(ws_.matmul_workspace.bytes() == kCublasLtWorkspaceBytes,
              "linear_forward: plan_workspace was not called");
  void* tail = static_cast<char*>(ws_.matmul_workspace.data()) + kProductWorkspaceBytes;
  cuda::cast(stream_, bias, DType::f32, tail, DType::bf16, n);
  return tail;
}

void CudaBackend::hold_weights(const Tensor& weights) {
  release_weights();
  const Tensor& copy = ws_.weights_copy;
  if (matmul_dtype_ == DType::f32 || copy.empty() || copy.dtype() != matmul_dtype_ ||
      weights.numel() > copy.numel())
    return;
  cuda::cast(stream_, on_gpu(weights, "held weights"), DType::f32, copy.data(), matmul_dtype_,
             weights.numel());
  weights_copy_.hold(weights.f32(), weights.numel(), copy);
}

void CudaBackend::hold_weight(const Tensor& w) {
  release_weight();
  const Tensor& copy = ws_.held_weight;
  if (matmul_dtype_ == DType::f32 || copy.empty() || w.numel() > copy.numel()) return;
  if (weights_copy_.find(w.data(), w.numel())) return;  // its copy is made already
  held_ = on_gpu(w, "held weight");
  cuda::cast(stream_, held_, DType::f32, copy.data(), matmul_dtype_, w.numel());
}

Tensor CudaBackend::hold_padded_weight(const Tensor& w, int64_t rows) {
  release_weight();
  const Tensor& copy = ws_.held_weight;
  BRISK_CHECK(w.rank() == 2 && rows >= w.dim(0), "hold_padded_weight: ", rows,
              " rows for a weight ", w.shape().str());
  const int64_t cols = w.dim(1);
  BRISK_CHECK(matmul_dtype_ == DType::bf16 && rows * cols <= copy.numel(),
              "hold_padded_weight: needs bf16 products and a held copy of ", rows * cols,
              " values (planned: ", copy.numel(), ")");
  cuda::cast(stream_, on_gpu(w, "held weight"), DType::f32, copy.data(), DType::bf16, w.numel());
  const size_t tail = static_cast<size_t>(rows * cols - w.numel()) * sizeof(uint16_t);
  cuda::check_cuda(
      cudaMemsetAsync(static_cast<uint16_t*>(copy.data()) + w.numel(), 0, tail, stream_),
      "hold_padded_weight");
  return Tensor(copy.data(), Shape{rows, cols}, DType::bf16, Device::cuda);
}

const void* CudaBackend::operand(cuda::In x, int64_t n, DType dtype, const Tensor& buffer) {
  BRISK_CHECK(!x.bf16 || dtype == DType::bf16, "internal error: a bf16 operand of a ",
              dtype_name(dtype), " product");
  if (dtype == DType::f32) return x.data;
  if (!x.bf16)
    if (const void* copy = weights_copy_.find(x.data, n)) return copy;
  if (held_ && x.data == held_ && !x.bf16 && n <= ws_.held_weight.numel())
    return ws_.held_weight.data();
  return packed(stream_, x, n, dtype, buffer);
}

const void* CudaBackend::gradient_operand(cuda::In g, int64_t m, int64_t n, DType dtype,
                                          int64_t* ld) {
  const int64_t padded = (n + 7) / 8 * 8;
  *ld = n;
  if (dtype == DType::f32 || g.bf16 || padded == n || m * padded > ws_.operand_a.numel())
    return operand(g, m * n, dtype, ws_.operand_a);
  cuda::cast_rows(stream_, static_cast<const float*>(g.data), m, n, ws_.operand_a.data(), dtype,
                  padded);
  *ld = padded;
  return ws_.operand_a.data();
}

bool CudaBackend::matmul(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const void* a,
                         int64_t lda, const void* b, int64_t ldb, bool accumulate, cuda::Out c,
                         int64_t ldc, const void* bias, DType dtype, const Epilogue& extra) {
  if (m == 0 || n == 0) return true;
  BRISK_CHECK(!c.bf16 || dtype == DType::bf16, "internal error: a bf16 output of a ",
              dtype_name(dtype), " product");
  BRISK_CHECK(!bias || extra.mode == CUBLASLT_EPILOGUE_DEFAULT,
              "internal error: a bias with another epilogue");
  const cublasLtEpilogue_t epi = bias ? CUBLASLT_EPILOGUE_BIAS : extra.mode;
  MatmulPlan* p = plan_for(PlanKey{trans_a, trans_b, m, n, k, lda, ldb, ldc, static_cast<int>(epi),
                                   static_cast<int>(dtype), tf32_,
                                   common_alignment({a, b, c.data, bias, extra.aux}), c.bf16},
                           extra.aux);
  if (p == nullptr) return false;
  if (bias)
    check_lt(cublaslt().MatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                               sizeof bias),
             "bias pointer");
  if (extra.aux)
    check_lt(cublaslt().MatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                               &extra.aux, sizeof extra.aux),
             "epilogue input pointer");
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  check_lt(
      cublaslt().Matmul(lt_, p->desc, &alpha, b, p->a, a, p->b, &beta, c.data, p->c, c.data, p->c,
                        &p->algo, ws_.matmul_workspace.data(), kProductWorkspaceBytes, stream_),
      "matmul");
  return true;
}

void CudaBackend::fill_ones() {
  cuda::fill(stream_, ws_.ones.f32(), 1.0f, ws_.ones.numel());
  if (!ws_.ones16.empty()) {  // 1.0 in 16 bits, cast from the float32 ones
    const int64_t n = std::min(ws_.ones.numel(), ws_.ones16.numel());
    cuda::cast(stream_, ws_.ones.f32(), DType::f32, ws_.ones16.data(), ws_.ones16.dtype(), n);
  }
  ones_ready_ = true;
}

// dw[rows, k] (+)= dy[:, :rows]^T x. A padded weight's gradient (padded: fewer rows than dy's
// columns) takes its rows in two products, a multiple of 64 and the few left: an odd row count in
// one product sends it to cuBLASLt's unaligned kernels, 4-6x slower (GPT-2's 50257).
void CudaBackend::weight_grad_rows(const Tensor& dw, int64_t k, int64_t m, const void* dy,
                                   int64_t ld, const void* x, bool accumulate, DType t,
                                   bool padded) {
  const int64_t rows = dw.dim(0), aligned = padded ? rows / 64 * 64 : rows;
  matmul(true, false, aligned, k, m, dy, ld, x, k, accumulate, cuda::f32_out(dw.f32()), k, nullptr,
         t);
  if (aligned == rows) return;
  const auto* tail = static_cast<const char*>(dy) + aligned * static_cast<int64_t>(dtype_size(t));
  matmul(true, false, rows - aligned, k, m, tail, ld, x, k, accumulate,
         cuda::f32_out(dw.f32() + aligned * k), k, nullptr, t);
}

void CudaBackend::linear_forward(const Tensor& x, const Tensor& w, const Tensor& b,
                                 WeightLayout layout, const Tensor& y) {
  const auto [m, k, n] = linear_dims(x, w, layout, "linear_forward");
  BRISK_CHECK(y.numel() == m * n, "linear_forward: output ", y.shape().str(), " does not hold ", m,
              " x ", n);
  BRISK_CHECK(b.empty() || b.numel() == n, "linear_forward: bias has ", b.numel(),
              " values, expected ", n);
  BRISK_CHECK(!ws_.matmul_workspace.empty(), "linear_forward: plan_workspace was not called");
  const bool out_in = layout == WeightLayout::out_in;
  const cuda::Out out = dev_out(y, "linear output");  // bf16: stores_product_output
  const void* bias = b.empty()  ? nullptr
                     : out.bf16 ? bias_operand(on_gpu(b, "linear bias"), n)
                                : on_gpu(b, "linear bias");
  const DType t = matmul_dtype_;
  matmul(false, out_in, m, n, k, operand(dev_in(x, "linear input"), m * k, t, ws_.operand_a), k,
         operand(weight_in(w, t), n * k, t, ws_.operand_b), out_in ? k : n, false, out, n, bias, t);
}

void CudaBackend::linear_backward(const Tensor& x, const Tensor& w, const Tensor& dy,
                                  WeightLayout layout, const Tensor& dx, bool accumulate_dx,
                                  const Tensor& dw, const Tensor& db, bool accumulate_dw) {
  backward_products(x, w, dy, layout, DxProduct{dx, accumulate_dx}, dw, db, accumulate_dw);
}

bool CudaBackend::bf16_activation_gradient(const Tensor& x, const Tensor& pre, DType round,
                                           const Tensor& dx) const {
  return switches_.bf16_activation_gradient && round == DType::bf16 &&
         bf16_activations(DType::bf16) && pre.dtype() == DType::bf16 && x.rank() > 0 &&
         pre.numel() == x.numel() && dx.numel() == x.numel() && dx.dtype() == DType::f32;
}

bool CudaBackend::fuses_activation_gradient(Activation kind, const Tensor& x) const {
  return switches_.fused_activation_gradient && kind == Activation::gelu_tanh && x.dim(-1) % 8 == 0;
}

Tensor CudaBackend::linear_activation_backward(const Tensor& x, const Tensor& w, const Tensor& dy,
                                               WeightLayout layout, Activation kind,
                                               const Tensor& pre, DType round, const Tensor& dx,
                                               const Tensor& dw, const Tensor& db,
                                               bool accumulate_dw) {
  if (!bf16_activation_gradient(x, pre, round, dx))
    return Backend::linear_activation_backward(x, w, dy, layout, kind, pre, round, dx, dw, db,
                                               accumulate_dw);
  const cuda::In p = dev_in(pre, "activation input");
  const Epilogue epilogue = fuses_activation_gradient(kind, x)
                                ? Epilogue{CUBLASLT_EPILOGUE_DGELU, pre.data()}
                                : Epilogue{};
  const Tensor d16(dx.data(), pre.shape(), DType::bf16, Device::cuda);
  // Without the epilogue the product stores dy W rounded to bf16 (activation_backward's round_dy,
  // as it would read it), and the activation's gradient follows in place.
  if (!backward_products(x, w, dy, layout, DxProduct{dx, false, true, epilogue}, dw, db,
                         accumulate_dw))
    cuda::activation_backward(stream_, kind, p, {d16.data(), true}, DType::f32, {d16.data(), true},
                              pre.numel());
  return d16;
}

bool CudaBackend::backward_products(const Tensor& x, const Tensor& w, const Tensor& dy,
                                    WeightLayout layout, const DxProduct& dxp, const Tensor& dw,
                                    const Tensor& db, bool accumulate_dw) {
  const Tensor& dx = dxp.f32;
  const auto [m, k, n] = linear_dims(x, w, layout, "linear_backward");
  BRISK_CHECK(dy.numel() == m * n, "linear_backward: gradient ", dy.shape().str(),
              " does not hold ", m, " x ", n);
  BRISK_CHECK(!ws_.matmul_workspace.empty(), "linear_backward: plan_workspace was not called");
  if (m == 0) {  // no rows: written gradients are zeros, added ones unchanged
    for (const Tensor* t : {&dw, &db})
      if (!accumulate_dw && !t->empty()) fill(*t, 0.0f);
    return false;
  }
  const cuda::In g = dev_in(dy, "linear gradient");
  const cuda::In wi = weight_in(w, matmul_dtype_);
  for (const Tensor* t : {&dx, &dw, &db})
    if (!t->empty()) on_gpu(*t, "linear gradient output");
  const bool out_in = layout == WeightLayout::out_in;
  const DType t = matmul_dtype_;
  // dy is packed (16-bit products) once for both products, into A's buffer, its rows ld apart;
  // dw's x goes into B's, which dx's weight no longer needs by then.
  int64_t ld = n;
  const void* pg = dx.empty() && dw.empty() ? nullptr : gradient_operand(g, m, n, t, &ld);
  bool epilogue = false;
  if (!dx.empty()) {
    BRISK_CHECK(dx.numel() == x.numel(), "linear_backward: dx size");
    BRISK_CHECK(!dxp.bf16 || (t == DType::bf16 && !dxp.accumulate),
                "internal error: a bf16 dx of a ", dtype_name(t), " product, or added to");
    const void* pw = operand(wi, n * k, t, ws_.operand_b);
    const int64_t ldw = out_in ? k : n;
    const cuda::Out out{dx.data(), dxp.bf16};
    if (dxp.extra.mode != CUBLASLT_EPILOGUE_DEFAULT)
      epilogue =
          matmul(false, !out_in, m, k, n, pg, ld, pw, ldw, false, out, k, nullptr, t, dxp.extra);
    if (!epilogue)
      matmul(false, !out_in, m, k, n, pg, ld, pw, ldw, dxp.accumulate, out, k, nullptr, t);
  }
  if (!dw.empty()) {
    // A padded weight's gradient: its first rows only (hold_padded_weight).
    const bool first_rows = out_in && dw.rank() == 2 && dw.dim(1) == k && dw.dim(0) <= n;
    BRISK_CHECK(dw.shape() == w.shape() || first_rows, "linear_backward: weight gradient shape ",
                dw.shape().str(), " differs from the weight's ", w.shape().str());
    const void* px = operand(dev_in(x, "linear input"), m * k, t, ws_.operand_b);
    if (out_in)
      weight_grad_rows(dw, k, m, pg, ld, px, accumulate_dw, t, first_rows && dw.dim(0) < n);
    else
      matmul(true, false, k, n, m, px, k, pg, ld, accumulate_dw, cuda::f32_out(dw.f32()), n,
             nullptr, t);
  }
  if (!db.empty()) {
    // A padded weight's bias gradient: its first columns only, as dw's rows.
    BRISK_CHECK(db.numel() == n || (out_in && db.numel() < n),
                "linear_backward: bias gradient has ", db.numel(), " values, expected ", n);
    bias_gradient(g, m, n, db, accumulate_dw);
  }
  return epilogue;
}

// db[1,nb] (+)= ones[1,m] dy[m,:nb]: in float32 whatever the operand type, but a bf16 dy's (a
// product's gradient written in bf16, linear_activation_backward's) with bf16 ones.
void CudaBackend::bias_gradient(cuda::In dy, int64_t m, int64_t n, const Tensor& db,
                                bool accumulate) {
  const Tensor& ones = dy.bf16 ? ws_.ones16 : ws_.ones;
  BRISK_CHECK(m <= ones.numel() && (!dy.bf16 || ones.dtype() == DType::bf16),
              "linear_backward: ", m,
              " rows exceed the planned ones (or a bf16 gradient in a run without bf16 ones)");
  if (!ones_ready_) fill_ones();
  matmul(false, false, 1, db.numel(), m, ones.data(), m, dy.data, n, accumulate,
         cuda::f32_out(db.f32()), db.numel(), nullptr, dy.bf16 ? DType::bf16 : DType::f32);
}

}  // namespace brisk
