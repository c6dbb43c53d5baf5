// bitsandbytes' saved 4-bit weights (see bnb_weights.h).
#include "core/bnb_weights.h"

#include <array>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>

#include "core/checked.h"
#include "core/error.h"
#include "core/quantization.h"

namespace brisk {

namespace {

constexpr const char* kStateKey = ".quant_state.bitsandbytes__";
constexpr const char* kStateParts[] = {".absmax", ".quant_map", ".nested_absmax",
                                       ".nested_quant_map", kStateKey};

// The tensor `name + part` of `f`, of `dtype` and `numel` values, or a clear refusal.
const Tensor& state_tensor(const SafetensorsFile& f, const std::string& name, const char* part,
                           DType dtype, int64_t numel) {
  const std::string key = name + part;
  BRISK_CHECK(f.has(key), f.path(), ": the 4-bit weight '", name, "' lacks '", key, "'");
  const Tensor& t = f.get(key);
  BRISK_CHECK(t.dtype() == dtype && t.numel() == numel, f.path(), ": '", key, "' is ",
              dtype_name(t.dtype()), " ", t.shape().str(), " where ", dtype_name(dtype), " of ",
              numel, " values is expected (a 4-bit checkpoint of another layout?)");
  return t;
}

// The map stored beside the weight must be bitsandbytes' (brisk dequantizes with its own copy).
void check_map(const SafetensorsFile& f, const std::string& key, const float* want, int n) {
  const float* got = f.get(key).f32();
  for (int i = 0; i < n; ++i)
    BRISK_CHECK(std::memcmp(got + i, want + i, 4) == 0, f.path(), ": '", key, "' value ", i, " is ",
                got[i], " where bitsandbytes' is ", want[i],
                " (a 4-bit checkpoint of another layout?)");
}

DType dtype_named(const std::string& s, const std::string& key) {
  if (s == "float32") return DType::f32;
  if (s == "bfloat16") return DType::bf16;
  if (s == "float16") return DType::f16;
  BRISK_FAIL(key, ": dtype \"", excerpt(s), "\" is not float32, bfloat16 or float16");
}

// One weight's state from its quant_state JSON and the tensors beside it.
Bnb4bitWeight read_weight(const SafetensorsFile& f, const std::string& name,
                          const std::string& type, const std::string& key) {
  const Tensor& raw = f.get(key);
  BRISK_CHECK(raw.dtype() == DType::u8 && raw.numel() <= 4096, f.path(), ": '", key,
              "' is not a short uint8 array of JSON text");
  nlohmann::json j = nlohmann::json::parse(
      std::string(static_cast<const char*>(raw.data()), static_cast<size_t>(raw.numel())), nullptr,
      false);
  BRISK_CHECK(j.is_object(), f.path(), ": '", key, "' is not a JSON object");
  const std::string where = f.path() + ": '" + key + "'";
  BRISK_CHECK(j.value("quant_type", std::string()) == type, where, ": quant_type \"",
              excerpt(j.value("quant_type", std::string())), "\" where its name says ", type);
  const nlohmann::json& shape = j.value("shape", nlohmann::json());
  BRISK_CHECK(shape.is_array() && !shape.empty() && shape.size() <= Shape::kMaxDims, where,
              ": no usable \"shape\"");
  Bnb4bitWeight w;
  w.file = &f;
  for (const auto& d : shape) {
    BRISK_CHECK(d.is_number_integer() && d.get<int64_t>() >= 1 && d.get<int64_t>() <= (1LL << 40),
                where, ": \"shape\" ", excerpt(shape.dump()), " is not a list of sizes");
    w.shape.push_back(d.get<int64_t>());
  }
  int64_t numel = 1;
  for (int i = 0; i < w.shape.rank(); ++i) numel = checked_mul(numel, w.shape[i], where.c_str());
  const int64_t blocksize = j.value("blocksize", int64_t{0});
  BRISK_CHECK(blocksize >= 32 && blocksize <= 4096 && (blocksize & (blocksize - 1)) == 0, where,
              ": blocksize ", blocksize, " is not a power of two in [32, 4096]");
  w.dtype = dtype_named(j.value("dtype", std::string()), where);
  const bool nested = j.contains("nested_blocksize");
  w.layout = {numel, blocksize, type == "fp4" ? Quant4Type::fp4 : Quant4Type::nf4, nested};
  state_tensor(f, name, "", DType::u8, w.layout.packed_bytes());
  const std::array<float, 16> codes = [&] {
    std::array<float, 16> c{};
    for (int i = 0; i < 16; ++i) c[i] = quant4_value(w.layout.type, i);
    return c;
  }();
  state_tensor(f, name, ".quant_map", DType::f32, 16);
  check_map(f, name + ".quant_map", codes.data(), 16);
  if (!nested) {
    state_tensor(f, name, ".absmax", DType::f32, w.layout.blocks());
    return w;
  }
  BRISK_CHECK(j.value("nested_blocksize", int64_t{0}) == Quant4Layout::kNestedBlock, where,
              ": nested_blocksize ", j["nested_blocksize"].dump(), " where bitsandbytes uses ",
              Quant4Layout::kNestedBlock);
  const nlohmann::json& offset = j.value("nested_offset", nlohmann::json());
  BRISK_CHECK(offset.is_number() && std::isfinite(offset.get<double>()), where,
              ": no finite nested_offset");
  w.offset = offset.get<float>();
  state_tensor(f, name, ".absmax", DType::u8, w.layout.blocks());
  state_tensor(f, name, ".nested_absmax", DType::f32, w.layout.nested_blocks());
  state_tensor(f, name, ".nested_quant_map", DType::f32, 256);
  const std::array<float, 256> map = dynamic_quant_map(true);
  check_map(f, name + ".nested_quant_map", map.data(), 256);
  return w;
}

}  // namespace

bool is_bnb_4bit_state(const std::string& name) {
  for (const char* part : kStateParts)
    if (name.find(part) != std::string::npos) return true;
  return false;
}

std::map<std::string, Bnb4bitWeight> find_bnb_4bit(const SafetensorsFile& f) {
  std::map<std::string, Bnb4bitWeight> out;
  for (const std::string& key : f.names()) {
    const size_t at = key.find(kStateKey);
    if (at == std::string::npos) continue;
    const std::string type = key.substr(at + std::strlen(kStateKey));
    BRISK_CHECK(type == "nf4" || type == "fp4", f.path(), ": '", excerpt(key, 100),
                "': 4-bit type \"", excerpt(type), "\" is not nf4 or fp4");
    const std::string name = key.substr(0, at);
    out[name] = read_weight(f, name, type, key);
  }
  return out;
}

void dequantize_bnb_4bit(const std::string& name, const Bnb4bitWeight& w, float* out) {
  const SafetensorsFile& f = *w.file;
  Quant4Host q;
  q.layout = w.layout;
  auto bytes = [&](const std::string& key) {
    const Tensor& t = f.get(key);
    const auto* p = static_cast<const uint8_t*>(t.data());
    return std::vector<uint8_t>(p, p + t.numel());
  };
  auto floats = [&](const std::string& key) {
    const Tensor& t = f.get(key);
    return std::vector<float>(t.f32(), t.f32() + t.numel());
  };
  q.packed = bytes(name);
  if (w.layout.nested) {
    q.qabsmax = bytes(name + ".absmax");
    q.absmax2 = floats(name + ".nested_absmax");
    q.offset = w.offset;
  } else {
    q.absmax = floats(name + ".absmax");
  }
  dequantize_4bit(q, out);
  const int64_t n = w.layout.numel;
  if (w.dtype == DType::bf16)
    for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_float(float_to_bf16(out[i]));
  if (w.dtype == DType::f16)
    for (int64_t i = 0; i < n; ++i) out[i] = fp16_to_float(float_to_fp16(out[i]));
}

}  // namespace brisk
