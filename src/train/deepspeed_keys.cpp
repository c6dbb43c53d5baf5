// DeepSpeed's config keys as its runtime reads them (deepspeed/runtime/config.py and the pydantic
// models of zero/config.py, zero/offload_config.py and precision_config.py, 2026).
#include "train/deepspeed_keys.h"

#include <algorithm>
#include <map>
#include <vector>

#include "core/error.h"
#include "train/options.h"

namespace brisk {
namespace {

using Keys = std::vector<std::string>;

// Every key of DeepSpeed's top level (sections brisk passes over are not looked into).
const Keys& top_level_keys() {
  static const Keys keys = {"train_batch_size",
                            "train_micro_batch_size_per_gpu",
                            "gradient_accumulation_steps",
                            "managed_gradient_accumulation",
                            "steps_per_print",
                            "dump_state",
                            "disable_allgather",
                            "communication_data_type",
                            "seq_parallel_communication_data_type",
                            "prescale_gradients",
                            "gradient_predivide_factor",
                            "gradient_allreduce_op",
                            "sparse_gradients",
                            "zero_optimization",
                            "activation_checkpointing",
                            "comms_logger",
                            "tensorboard",
                            "wandb",
                            "csv_monitor",
                            "comet",
                            "gradient_clipping",
                            "fp16",
                            "bf16",
                            "bfloat16",
                            "amp",
                            "torch_autocast",
                            "compression_training",
                            "graph_harvesting",
                            "optimizer",
                            "zero_allow_untested_optimizer",
                            "zero_force_ds_cpu_optimizer",
                            "scheduler",
                            "flops_profiler",
                            "wall_clock_breakdown",
                            "memory_breakdown",
                            "autotuning",
                            "eigenvalue",
                            "use_data_before_expert_parallelism",
                            "hybrid_engine",
                            "sparse_attention",
                            "pipeline",
                            "progressive_layer_drop",
                            "curriculum_learning",
                            "data_efficiency",
                            "checkpoint",
                            "data_types",
                            "aio",
                            "dataloader_drop_last",
                            "log_level",
                            "nebula",
                            "datastates_ckpt",
                            "weight_quantization",
                            "compile",
                            "timers",
                            "tensor_parallel",
                            "expert_parallel",
                            "elasticity",
                            "sequence_parallel_size",
                            "data_parallel_size",
                            "vocabulary_size"};
  return keys;
}

// zero_optimization: its fields, under both names where DeepSpeed has an alias.
const Keys& zero_keys() {
  static const Keys keys = {"stage",
                            "contiguous_gradients",
                            "reduce_scatter",
                            "reduce_bucket_size",
                            "use_multi_rank_bucket_allreduce",
                            "allgather_partitions",
                            "allgather_bucket_size",
                            "overlap_comm",
                            "load_from_fp32_weights",
                            "elastic_checkpoint",
                            "offload_param",
                            "offload_optimizer",
                            "zenflow",
                            "sub_group_size",
                            "cpu_offload_param",
                            "cpu_offload_use_pin_memory",
                            "cpu_offload",
                            "prefetch_bucket_size",
                            "stage3_prefetch_bucket_size",
                            "param_persistence_threshold",
                            "stage3_param_persistence_threshold",
                            "model_persistence_threshold",
                            "stage3_model_persistence_threshold",
                            "max_live_parameters",
                            "stage3_max_live_parameters",
                            "max_reuse_distance",
                            "stage3_max_reuse_distance",
                            "gather_16bit_weights_on_model_save",
                            "stage3_gather_16bit_weights_on_model_save",
                            "stage3_gather_fp16_weights_on_model_save",
                            "module_granularity_threshold",
                            "stage3_module_granularity_threshold",
                            "use_all_reduce_for_fetch_params",
                            "stage3_use_all_reduce_for_fetch_params",
                            "allgather_sequential",
                            "stage3_allgather_sequential",
                            "ignore_unused_parameters",
                            "legacy_stage1",
                            "round_robin_gradients",
                            "zero_hpz_partition_size",
                            "zero_quantized_weights",
                            "zero_quantized_nontrainable_weights",
                            "zero_quantized_gradients",
                            "zeropp_loco_param",
                            "mics_shard_size",
                            "mics_hierarchical_params_gather",
                            "memory_efficient_linear",
                            "pipeline_loading_checkpoint",
                            "override_module_apply",
                            "log_trace_cache_warnings",
                            "enable_sanity_checks",
                            "save_muon_momentum_buffer_in_memory",
                            "leaf_module"};
  return keys;
}

// The sections read strictly, by their path in the config.
const std::map<std::string, Keys>& sections() {
  static const Keys bf16 = {"enabled", "immediate_grad_update", "check_grad_overflow",
                            "bf16_master_weights_and_grads", "bf16_optimizer_states"};
  static const std::map<std::string, Keys> all = {
      {"", top_level_keys()},
      {"zero_optimization", zero_keys()},
      // TPTrainingConfig (AutoTP), with its aliases tp and kernel_inject.
      {"tensor_parallel",
       {"dtype", "autotp_size", "tp_overlap_comm", "tensor_parallel", "tp",
        "injection_policy_tuple", "partition_config", "preset_model", "keep_module_on_host",
        "replace_with_kernel_inject", "kernel_inject"}},
      {"tensor_parallel.tensor_parallel", {"tp_size", "tp_grain_size", "mpu", "tp_group"}},
      {"tensor_parallel.tp", {"tp_size", "tp_grain_size", "mpu", "tp_group"}},
      {"zero_optimization.offload_param",
       {"device", "nvme_path", "buffer_count", "buffer_size", "max_in_cpu", "pin_memory"}},
      {"zero_optimization.offload_optimizer",
       {"device", "nvme_path", "buffer_count", "pin_memory", "pipeline_read", "pipeline_write",
        "fast_init", "ratio", "super_offload", "cpuadam_cores_perc"}},
      {"fp16",
       {"enabled", "auto_cast", "loss_scale", "initial_scale_power", "loss_scale_window",
        "hysteresis", "consecutive_hysteresis", "min_loss_scale", "fp16_master_weights_and_grads"}},
      {"bf16", bf16},
      {"bfloat16", bf16}};
  return all;
}

void check_section(const nlohmann::json& section, const std::string& path, const Keys& known,
                   const std::string& origin) {
  const std::string prefix = path.empty() ? "" : path + ".";
  for (const auto& [key, value] : section.items()) {
    if (std::find(known.begin(), known.end(), key) == known.end()) {
      const std::string near = closest_name(key, known);
      BRISK_FAIL(origin, ": ", prefix, excerpt(key), " is not a DeepSpeed key",
                 near.empty() ? "" : " (did you mean " + prefix + near + "?)");
    }
    const auto inner = sections().find(prefix + key);
    if (inner != sections().end() && value.is_object())
      check_section(value, prefix + key, inner->second, origin);
  }
}

}  // namespace

void check_deepspeed_keys(const nlohmann::json& ds, const std::string& origin) {
  if (ds.is_object()) check_section(ds, "", top_level_keys(), origin);
}

}  // namespace brisk
