// --parallelism_config: accelerate's ParallelismConfig keys as brisk's options.
#include "train/parallelism_config.h"

#include <map>
#include <string>

#include "core/error.h"
#include "core/json_file.h"

namespace brisk {

namespace {
constexpr const char* kDegrees[] = {"dp_replicate_size", "dp_shard_size", "tp_size", "cp_size",
                                    "sp_size"};
// accelerate's handler objects: their settings have no meaning in brisk; empty or null only.
constexpr const char* kHandlers[] = {"tp_handler", "cp_handler", "sp_handler"};

// Every degree the file gives (1 where it is absent), refusing what is not one.
std::map<std::string, int64_t> read_degrees(const nlohmann::json& j, const std::string& origin) {
  BRISK_CHECK(j.is_object(), origin, ": not a JSON object of ParallelismConfig's keys");
  std::map<std::string, int64_t> degree;
  for (const char* key : kDegrees) degree[key] = 1;
  for (const auto& [key, value] : j.items()) {
    bool handler = false;
    for (const char* h : kHandlers) handler |= key == h;
    if (handler) {
      BRISK_CHECK(value.is_null() || (value.is_object() && value.empty()), origin, ": ", key,
                  " has settings brisk does not have; leave it out");
      continue;
    }
    BRISK_CHECK(degree.count(key) != 0, origin, ": unknown key '", excerpt(key),
                "' (valid: dp_replicate_size, dp_shard_size, tp_size, cp_size, sp_size)");
    if (value.is_null()) continue;
    BRISK_CHECK(
        value.is_number_integer() && value.get<int64_t>() >= 1 && value.get<int64_t>() <= 4096,
        origin, ": ", key, " must be a whole number in [1, 4096], got ", excerpt(value.dump()));
    degree[key] = value.get<int64_t>();
  }
  return degree;
}
}  // namespace

TrainOptions apply_parallelism_config(const TrainOptions& given, int ranks) {
  if (given.parallelism_config.empty()) return given;
  const std::string origin = "--parallelism_config '" + excerpt(given.parallelism_config) + "'";
  std::map<std::string, int64_t> d =
      read_degrees(read_json_file(given.parallelism_config, origin), origin);
  BRISK_CHECK(d["cp_size"] == 1, origin, ": cp_size = ", d["cp_size"],
              " (context parallelism) is not in brisk yet");
  BRISK_CHECK(d["dp_replicate_size"] == 1 || d["dp_shard_size"] == 1, origin,
              ": dp_replicate_size and dp_shard_size both above 1 (hybrid sharding) is not in "
              "brisk yet");
  for (const char* key : {"tp_size", "sp_size"}) {
    const int64_t flag = key[0] == 't' ? given.tp_size : given.sp_size;
    BRISK_CHECK(flag <= 1 || flag == d[key], origin, ": ", key, " = ", d[key], " but --", key, " ",
                flag);
  }
  const int64_t product = d["dp_replicate_size"] * d["dp_shard_size"] * d["tp_size"] * d["sp_size"];
  BRISK_CHECK(product == ranks, origin,
              ": dp_replicate_size x dp_shard_size x tp_size x sp_size = ", product,
              " but the run has ", ranks, " process", ranks == 1 ? "" : "es");
  TrainOptions o = given;
  o.tp_size = d["tp_size"];
  o.sp_size = d["sp_size"];
  for (const char* key : {"tp_size", "sp_size"})
    if (d[key] > 1) o.set_by[key] = origin + ": " + key;
  if (d["dp_shard_size"] > 1) {
    BRISK_CHECK(given.zero_stage == 0 || given.zero_stage == 3, origin,
                ": dp_shard_size shards the model states as --zero_stage 3 does, but --zero_stage ",
                given.zero_stage, " is given");
    o.zero_stage = 3;
  }
  return o;
}

}  // namespace brisk
