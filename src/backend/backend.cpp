// Backend choice and the device-independent helpers of the backend interface.
#include "backend/backend.h"

#include <vector>

namespace brisk {

AttentionBuffers attention_buffers(Device device, int64_t batch, int64_t heads, int64_t seq) {
  if (device == Device::cuda)  // flash attention: one log-sum-exp per row; scratch for its delta
    return {Shape{batch, heads, seq}, false, Shape{batch, heads, seq}};
  return {Shape{batch, heads, seq, seq}, true, Shape{batch, heads, seq, seq}};
}

AttentionDims attention_dims(const Tensor& qkv, int heads, const char* op) {
  BRISK_CHECK(qkv.rank() == 3 && qkv.dim(2) % 3 == 0, op, ": qkv must be [B, T, 3C], got ",
              qkv.shape().str());
  const int64_t C = qkv.dim(2) / 3;
  BRISK_CHECK(heads > 0 && C % heads == 0, op, ": ", C, " channels do not split into ", heads,
              " heads");
  return {qkv.dim(0), qkv.dim(1), C, heads, C / heads};
}

std::unique_ptr<Backend> make_backend(Device device) {
  return device == Device::cuda ? make_cuda_backend() : make_cpu_backend();
}

void check_param_slots(const std::vector<ParamSlot>* slots, int64_t n, const char* op) {
  BRISK_CHECK(slots != nullptr, op, ": no parameter slots");
  for (const ParamSlot& s : *slots)
    BRISK_CHECK(
        s.offset >= 0 && s.numel >= 0 && s.offset + s.numel <= n && s.rows * s.cols == s.numel, op,
        ": a parameter slot lies outside the flat buffers");
}

void with_host_view(Backend& be, const Tensor& t, bool read, bool write,
                    const std::function<void(const Tensor&)>& fn) {
  if (t.device() == Device::cpu) {
    fn(t);
    return;
  }
  std::vector<unsigned char> bytes(t.bytes());
  const Tensor host(bytes.data(), t.shape(), t.dtype(), Device::cpu);
  if (read) be.download(t, host);
  fn(host);
  if (write) {
    be.upload(host, t);
    be.synchronize();  // the temporary goes away on return
  }
}

}  // namespace brisk
