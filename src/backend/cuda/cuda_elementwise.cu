// Elementwise CUDA kernels: the MLP activations (one kernel per kind, with the CPU's formulas from
// backend/activation.h) and the gated SwiGLU, tanh, dropout from the counter-based RNG, adds, fills
// and conversions between float32 and the 16-bit formats.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "backend/activation.h"
#include "backend/cuda/cuda_elements.cuh"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_launch.h"

namespace brisk::cuda {

namespace {

template <Activation A, typename X, typename Y>
__global__ void activation_forward_kernel(const X* x, Y* y, int64_t n) {
  for (int64_t i = global_thread(); i < n; i += grid_threads())
    put(y + i, activation_value<A>(widen(x[i])));
}

// dx may alias dy (both of type G): each element is read before it is written, by the same
// thread. dy is rounded to round_dy as it is read.
template <Activation A, typename X, typename G>
__global__ void activation_backward_kernel(const X* x, const G* dy, DType round_dy, G* dx,
                                           int64_t n) {
  for (int64_t i = global_thread(); i < n; i += grid_threads())
    put(dx + i, activation_grad<A>(widen(x[i]), rounded(widen(dy[i]), round_dy)));
}

// Element i of out is pair (row, c) = (i / F, i % F) of gate_up's halves.
template <typename G, typename Y>
__global__ void swiglu_forward_kernel(const G* gate_up, Y* out, int64_t n, int64_t F) {
  for (int64_t i = global_thread(); i < n; i += grid_threads()) {
    const int64_t r = i / F, c = i - r * F;
    const G* gate = gate_up + r * 2 * F + c;
    put(out + i, activation_value<Activation::silu>(widen(gate[0])) * widen(gate[F]));
  }
}

// One thread reads both inputs of a pair before writing both gradients: dgate_up may alias gate_up.
template <typename G, typename D>
__global__ void swiglu_backward_kernel(const G* gate_up, const float* dout, DType round_dout,
                                       D* dgate_up, int64_t n, int64_t F) {
  for (int64_t i = global_thread(); i < n; i += grid_threads()) {
    const int64_t r = i / F, c = i - r * F;
    const G* gate = gate_up + r * 2 * F + c;
    const float v = widen(gate[0]), u = widen(gate[F]), g = rounded(dout[i], round_dout);
    D* d = dgate_up + r * 2 * F + c;
    put(d, activation_grad<Activation::silu>(v, g * u));
    put(d + F, g * activation_value<Activation::silu>(v));
  }
}

__global__ void tanh_forward_kernel(const float* x, float* y, int64_t n) {
  for (int64_t i = global_thread(); i < n; i += grid_threads()) y[i] = tanhf(x[i]);
}

__global__ void tanh_backward_kernel(const float* y, const float* dy, float* dx, int64_t n) {
  for (int64_t i = global_thread(); i < n; i += grid_threads()) {
    const float t = y[i];
    dx[i] = dy[i] * (1.0f - t * t);
  }
}

// One thread per group of four elements: rng_block yields the words of exactly those elements, so
// each Philox evaluation is used in full (dropout_keep would recompute it per element). Element
// i's word is rng_block(key, i / 4).v[i % 4], as on the CPU. With 16-byte aligned pointers a full
// group moves as one float4, which keeps the accesses coalesced. out may alias in or add (the
// same element is read before it is written, by the same thread).
// `in` is float32 or bf16 (a branch's product stored rounded, Backend::stores_product_output),
// read widened; only float32 moves as float4. The scaling is its own rounding (__fmul_rn: never
// fused with the add), as on the CPU and in dropout_add_norm.
template <bool kAdd, typename TIn>
__global__ void dropout_kernel(const TIn* in, const float* add, float* out, int64_t n, RngKey key,
                               uint32_t threshold, float scale, bool vec4) {
  const int64_t groups = (n + 3) / 4;
  // A call over part of the tensor (RngKey::first_element): its element i draws the word of
  // element first_element + i; off the groups of four, each element's own.
  const bool whole_groups = key.first_element % 4 == 0;
  for (int64_t g = global_thread(); g < groups; g += grid_threads()) {
    if (!whole_groups) {
      for (int j = 0; j < 4; ++j) {
        const int64_t i = 4 * g + j;
        if (i >= n) break;
        const uint64_t e = key.first_element + static_cast<uint64_t>(i);
        const float kept =
            rng_block(key, e / 4).v[e % 4] >= threshold ? __fmul_rn(widen(in[i]), scale) : 0.0f;
        out[i] = kAdd ? add[i] + kept : kept;
      }
      continue;
    }
    const Philox4 words = rng_block(key, key.first_element / 4 + static_cast<uint64_t>(g));
    if (std::is_same_v<TIn, float> && vec4 && 4 * g + 4 <= n) {
      const float4 x = reinterpret_cast<const float4*>(in)[g];
      float4 y;
      y.x = words.v[0] >= threshold ? __fmul_rn(x.x, scale) : 0.0f;
      y.y = words.v[1] >= threshold ? __fmul_rn(x.y, scale) : 0.0f;
      y.z = words.v[2] >= threshold ? __fmul_rn(x.z, scale) : 0.0f;
      y.w = words.v[3] >= threshold ? __fmul_rn(x.w, scale) : 0.0f;
      if constexpr (kAdd) {
        const float4 a = reinterpret_cast<const float4*>(add)[g];
        y.x = a.x + y.x;
        y.y = a.y + y.y;
        y.z = a.z + y.z;
        y.w = a.w + y.w;
      }
      reinterpret_cast<float4*>(out)[g] = y;
      continue;
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t i = 4 * g + j;
      if (i < n) {
        const float kept = words.v[j] >= threshold ? __fmul_rn(widen(in[i]), scale) : 0.0f;
        out[i] = kAdd ? add[i] + kept : kept;
      }
    }
  }
}

bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// y may alias x (p == 0 dropout_add with out == in); b float32 or bf16.
template <typename B>
__global__ void add_kernel(const float* a, const B* b, float* y, int64_t n) {
  for (int64_t i = global_thread(); i < n; i += grid_threads()) y[i] = a[i] + widen(b[i]);
}

__global__ void fill_kernel(float* x, float value, int64_t n) {
  for (int64_t i = global_thread(); i < n; i += grid_threads()) x[i] = value;
}

__global__ void scale_kernel(float* x, float factor, int64_t n) {
  for (int64_t i = global_thread(); i < n; i += grid_threads()) x[i] *= factor;
}

// The cuda_fp16 / cuda_bf16 intrinsics round to nearest even, keep NaN a NaN (as the canonical
// quiet NaN, where the CPU keeps the payload) and turn fp16 overflow into inf, as the CPU does.
__global__ void f32_to_bf16_kernel(const float* in, __nv_bfloat16* out, int64_t n) {
  for (int64_t i = global_thread(); i < n; i += grid_threads()) out[i] = __float2bfloat16_rn(in[i]);
}
__global__ void f32_to_f16_kernel(const float* in, __half* out, int64_t n) {
  for (int64_t i = global_thread(); i < n; i += grid_threads()) out[i] = __float2half_rn(in[i]);
}
// Rows of `cols` float32 values into 16-bit rows `ld` apart (the padding left as it was).
template <typename H>
__global__ void f32_rows_to_half_kernel(const float* in, int64_t rows, int64_t cols, H* out,
                                        int64_t ld) {
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y)
    for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < cols;
         c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
      if constexpr (std::is_same_v<H, __nv_bfloat16>)
        out[r * ld + c] = __float2bfloat16_rn(in[r * cols + c]);
      else
        out[r * ld + c] = __float2half_rn(in[r * cols + c]);
    }
}
__global__ void bf16_to_f32_kernel(const __nv_bfloat16* in, float* out, int64_t n) {
  for (int64_t i = global_thread(); i < n; i += grid_threads()) out[i] = __bfloat162float(in[i]);
}
__global__ void f16_to_f32_kernel(const __half* in, float* out, int64_t n) {
  for (int64_t i = global_thread(); i < n; i += grid_threads()) out[i] = __half2float(in[i]);
}

// dst may alias src.
__global__ void round_bf16_kernel(const float* src, float* dst, int64_t n) {
  for (int64_t i = global_thread(); i < n; i += grid_threads())
    dst[i] = __bfloat162float(__float2bfloat16_rn(src[i]));
}
__global__ void round_f16_kernel(const float* src, float* dst, int64_t n) {
  for (int64_t i = global_thread(); i < n; i += grid_threads())
    dst[i] = __half2float(__float2half_rn(src[i]));
}

bool is_float16(DType t) {
  return t == DType::bf16 || t == DType::f16;
}

void copy_async(cudaStream_t s, const void* src, void* dst, int64_t bytes) {
  if (src == dst) return;
  check_cuda(cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyDeviceToDevice, s),
             "device-to-device copy");
}

}  // namespace

void activation_forward(cudaStream_t s, Activation kind, In x, Out y, int64_t n) {
  if (n <= 0) return;
  visit_activation(kind, [&](auto a) {
    with_elements(x.bf16, [&](auto xt) {
      with_elements(y.bf16, [&](auto yt) {
        using X = decltype(xt);
        using Y = decltype(yt);
        activation_forward_kernel<decltype(a)::value><<<grid_for(n), kThreads, 0, s>>>(
            static_cast<const X*>(x.data), static_cast<Y*>(y.data), n);
      });
    });
  });
  check_launch("activation_forward");
}

void activation_backward(cudaStream_t s, Activation kind, In x, In dy, DType round_dy, Out dx,
                         int64_t n) {
  if (n <= 0) return;
  BRISK_CHECK(dy.bf16 == dx.bf16, "activation_backward: dy and dx of different types");
  visit_activation(kind, [&](auto a) {
    with_elements(x.bf16, [&](auto xt) {
      with_elements(dy.bf16, [&](auto g) {
        using G = decltype(g);
        activation_backward_kernel<decltype(a)::value><<<grid_for(n), kThreads, 0, s>>>(
            static_cast<const decltype(xt)*>(x.data), static_cast<const G*>(dy.data), round_dy,
            static_cast<G*>(dx.data), n);
      });
    });
  });
  check_launch("activation_backward");
}

void swiglu_forward(cudaStream_t s, In gate_up, Out out, int64_t rows, int64_t F) {
  const int64_t n = rows * F;
  if (n <= 0) return;
  with_elements(gate_up.bf16, [&](auto gt) {
    with_elements(out.bf16, [&](auto yt) {
      swiglu_forward_kernel<<<grid_for(n), kThreads, 0, s>>>(
          static_cast<const decltype(gt)*>(gate_up.data), static_cast<decltype(yt)*>(out.data), n,
          F);
    });
  });
  check_launch("swiglu_forward");
}

void swiglu_backward(cudaStream_t s, In gate_up, const float* dout, DType round_dout, Out dgate_up,
                     int64_t rows, int64_t F) {
  const int64_t n = rows * F;
  if (n <= 0) return;
  with_elements(gate_up.bf16, [&](auto gt) {
    with_elements(dgate_up.bf16, [&](auto dt) {
      swiglu_backward_kernel<<<grid_for(n), kThreads, 0, s>>>(
          static_cast<const decltype(gt)*>(gate_up.data), dout, round_dout,
          static_cast<decltype(dt)*>(dgate_up.data), n, F);
    });
  });
  check_launch("swiglu_backward");
}

void tanh_forward(cudaStream_t s, const float* x, float* y, int64_t n) {
  if (n <= 0) return;
  tanh_forward_kernel<<<grid_for(n), kThreads, 0, s>>>(x, y, n);
  check_launch("tanh_forward");
}

void tanh_backward(cudaStream_t s, const float* y, const float* dy, float* dx, int64_t n) {
  if (n <= 0) return;
  tanh_backward_kernel<<<grid_for(n), kThreads, 0, s>>>(y, dy, dx, n);
  check_launch("tanh_backward");
}

void dropout(cudaStream_t s, In in, const float* add, float p, RngKey key, float* out, int64_t n) {
  BRISK_CHECK(p >= 0.0f && p < 1.0f, "dropout probability ", p, " is outside [0, 1)");
  BRISK_CHECK(add || !in.bf16, "internal error: dropout of a bf16 input without an add");
  if (n <= 0) return;
  with_elements(in.bf16, [&](auto zero) {
    using T = decltype(zero);
    const T* x = static_cast<const T*>(in.data);
    if (p == 0.0f) {
      // Every element is kept with scale 1: no random numbers needed.
      if (add)
        add_kernel<<<grid_for(n), kThreads, 0, s>>>(add, x, out, n);
      else
        copy_async(s, x, out, n * static_cast<int64_t>(sizeof(float)));
      return;
    }
    const uint32_t threshold = dropout_threshold(p);
    const float scale = 1.0f / (1.0f - p);
    const unsigned grid = grid_for((n + 3) / 4);
    const bool vec4 = aligned16(x) && aligned16(out) && (!add || aligned16(add));
    if (add)
      dropout_kernel<true><<<grid, kThreads, 0, s>>>(x, add, out, n, key, threshold, scale, vec4);
    else
      dropout_kernel<false>
          <<<grid, kThreads, 0, s>>>(x, nullptr, out, n, key, threshold, scale, vec4);
  });
  check_launch("dropout");
}

void add_inplace(cudaStream_t s, float* y, const float* x, int64_t n) {
  if (n <= 0) return;
  add_kernel<<<grid_for(n), kThreads, 0, s>>>(y, x, y, n);
  check_launch("add_inplace");
}

void fill(cudaStream_t s, float* x, float value, int64_t n) {
  if (n <= 0) return;
  fill_kernel<<<grid_for(n), kThreads, 0, s>>>(x, value, n);
  check_launch("fill");
}

void scale(cudaStream_t s, float* x, float factor, int64_t n) {
  if (n <= 0) return;
  scale_kernel<<<grid_for(n), kThreads, 0, s>>>(x, factor, n);
  check_launch("scale");
}

void cast_rows(cudaStream_t s, const float* src, int64_t rows, int64_t cols, void* dst,
               DType dst_type, int64_t ld) {
  BRISK_CHECK(is_float16(dst_type) && ld >= cols, "cast_rows: float32 rows into 16-bit rows");
  if (rows <= 0 || cols <= 0) return;
  const dim3 grid(grid_for(cols, kThreads, 64),
                  static_cast<unsigned>(std::min<int64_t>(rows, 65535)));
  if (dst_type == DType::bf16)
    f32_rows_to_half_kernel<<<grid, kThreads, 0, s>>>(src, rows, cols,
                                                      static_cast<__nv_bfloat16*>(dst), ld);
  else
    f32_rows_to_half_kernel<<<grid, kThreads, 0, s>>>(src, rows, cols, static_cast<__half*>(dst),
                                                      ld);
  check_launch("cast_rows");
}

void cast(cudaStream_t s, const void* src, DType src_type, void* dst, DType dst_type, int64_t n) {
  if (src_type == dst_type) {
    if (n > 0) copy_async(s, src, dst, n * static_cast<int64_t>(dtype_size(src_type)));
    return;
  }
  const bool to_half = src_type == DType::f32 && is_float16(dst_type);
  const bool from_half = is_float16(src_type) && dst_type == DType::f32;
  BRISK_CHECK(to_half || from_half, "cast from ", dtype_name(src_type), " to ",
              dtype_name(dst_type), " is not supported");
  if (n <= 0) return;
  const unsigned grid = grid_for(n);
  if (to_half && dst_type == DType::bf16) {
    f32_to_bf16_kernel<<<grid, kThreads, 0, s>>>(static_cast<const float*>(src),
                                                 static_cast<__nv_bfloat16*>(dst), n);
  } else if (to_half) {
    f32_to_f16_kernel<<<grid, kThreads, 0, s>>>(static_cast<const float*>(src),
                                                static_cast<__half*>(dst), n);
  } else if (src_type == DType::bf16) {
    bf16_to_f32_kernel<<<grid, kThreads, 0, s>>>(static_cast<const __nv_bfloat16*>(src),
                                                 static_cast<float*>(dst), n);
  } else {
    f16_to_f32_kernel<<<grid, kThreads, 0, s>>>(static_cast<const __half*>(src),
                                                static_cast<float*>(dst), n);
  }
  check_launch("cast");
}

void round_to(cudaStream_t s, DType type, const float* src, float* dst, int64_t n) {
  if (type == DType::f32) {
    if (n > 0) copy_async(s, src, dst, n * static_cast<int64_t>(sizeof(float)));
    return;
  }
  BRISK_CHECK(is_float16(type), "round_to: ", dtype_name(type), " is not a 16-bit float");
  if (n <= 0) return;
  if (type == DType::bf16) {
    round_bf16_kernel<<<grid_for(n), kThreads, 0, s>>>(src, dst, n);
  } else {
    round_f16_kernel<<<grid_for(n), kThreads, 0, s>>>(src, dst, n);
  }
  check_launch("round_to");
}

}  // namespace brisk::cuda
