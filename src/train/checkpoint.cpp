// Checkpoint folders: atomic save by folder rename, validated load, rotation.
#include "train/checkpoint.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "adapters/attach.h"
#include "core/json_file.h"
#include "core/safetensors.h"
#include "parallel/zero.h"
#include "train/file_data.h"

namespace brisk {

namespace fs = std::filesystem;

namespace {

// The model's config as transformers writes it: its source, with the class it was saved from
// and the dtype of the tensors in model.safetensors beside it, under both names transformers
// reads (torch_dtype, and dtype from transformers 4.56 on). A dtype copied from the input config
// (bfloat16) would make transformers load the saved float32 weights in bf16.
nlohmann::json saved_config(const Model& model, DType weights) {
  nlohmann::json j = model.config().source;
  j["architectures"] = {model.class_name()};
  j["torch_dtype"] = dtype_name(weights);
  j["dtype"] = dtype_name(weights);
  return j;
}
// The dtype write_model_weights writes: the weights' own, or float32 gathered.
DType saved_dtype(const Tensor& weights, const GatheredReads* gathered) {
  return gathered ? DType::f32 : weights.dtype();
}

// A checkpoint's files: the model's (transformers' or, for an adapter, PEFT's) and the trainer's.
constexpr const char* kModelFiles[] = {"model.safetensors", "config.json"};
constexpr const char* kAdapterFiles[] = {"adapter_model.safetensors", "adapter_config.json"};
constexpr const char* kTrainerFiles[] = {"optimizer.safetensors", "scheduler.json",
                                         "trainer_state.json", "training_args.json"};

// The file of `files` missing from `dir` (nullptr: none).
template <size_t N>
const char* missing_file(const fs::path& dir, const char* const (&files)[N]) {
  std::error_code ec;
  for (const char* f : files)
    if (!fs::is_regular_file(dir / f, ec)) return f;
  return nullptr;
}

// The first file a complete checkpoint needs that `dir` lacks (nullptr: complete).
const char* checkpoint_lacks(const fs::path& dir) {
  const char* model = missing_file(dir, kModelFiles);
  if (model && !missing_file(dir, kAdapterFiles)) model = nullptr;  // an adapter's checkpoint
  return model ? model : missing_file(dir, kTrainerFiles);
}

void write_json(const fs::path& path, const nlohmann::json& j) {
  write_file_atomically(path.string(), j.dump(2) + "\n");
}

nlohmann::json read_json(const fs::path& path) {
  // trainer_state.json grows with the log history: 64 MiB holds ~10^6 records.
  return read_json_file(path.string(), "checkpoint file", size_t{64} << 20);
}

// Reads a piece of a tensor in the backend's memory into host memory (a checkpoint streams the
// weights and optimizer state from where they live, never copying them whole).
DeviceReader reader_for(Backend& be) {
  return [&be](const Tensor& t, size_t offset, size_t bytes, void* dst) {
    be.download(
        Tensor(t.as<uint8_t>() + offset, Shape{static_cast<int64_t>(bytes)}, DType::u8, t.device()),
        Tensor(dst, Shape{static_cast<int64_t>(bytes)}, DType::u8));
  };
}

// model.safetensors: the flat float32 weights under transformers' names, from `weights` or
// (ZeRO) gathered piece by piece.
void write_model_weights(Backend& be, const std::string& path, const Model& model,
                         const Tensor& weights, GatheredReads* gathered) {
  const std::map<std::string, std::string> metadata{{"format", "pt"}};
  if (!gathered)
    return write_safetensors(path, model.named_views(weights), metadata, reader_for(be));
  std::vector<StreamedTensor> out;
  for (const ParamInfo& p : model.params().list())
    out.push_back(
        {p.name, DType::f32, p.full_shape(),
         [gathered, &p](size_t at, size_t n, void* dst) { gathered->read_param(p, at, n, dst); }});
  write_streamed_safetensors(path, out, metadata);
}

// optimizer.safetensors: the optimizer's named state and its step count, from the optimizer or
// (ZeRO) every rank's state gathered piece by piece.
void write_optimizer_state(Backend& be, const Optimizer& optimizer, const std::string& path,
                           GatheredReads* gathered) {
  const std::vector<std::pair<std::string, Tensor>> own = optimizer.state();
  int64_t step = optimizer.steps();
  if (!gathered) {
    std::vector<std::pair<std::string, Tensor>> out = own;
    out.emplace_back("step", Tensor(&step, Shape{}, DType::i64));
    return write_safetensors(path, out, {}, reader_for(be));
  }
  BRISK_CHECK(gathered->size() == own.size() + 1, "internal error: ", gathered->size(),
              " gathered parts for ", own.size(), " state tensors");
  std::vector<StreamedTensor> out;
  for (size_t i = 0; i < own.size(); ++i) {
    const DType dtype = own[i].second.dtype();
    const int64_t bytes = gathered->state_bytes(i), size = dtype_size(dtype);
    BRISK_CHECK(bytes % size == 0, "internal error: ", own[i].first, " gathered as ", bytes,
                " bytes");
    out.push_back(
        {own[i].first, dtype, Shape{bytes / size},
         [gathered, i](size_t at, size_t n, void* dst) { gathered->read_state(i, at, n, dst); }});
  }
  out.push_back({"step", DType::i64, Shape{}, [&step](size_t at, size_t n, void* dst) {
                   std::memcpy(dst, reinterpret_cast<const char*>(&step) + at, n);
                 }});
  write_streamed_safetensors(path, out);
}

void read_optimizer_state(Backend& be, const std::string& path, Optimizer& optimizer,
                          const StateShare* share) {
  SafetensorsFile file(path);
  const auto named = optimizer.state();
  BRISK_CHECK(
      !share || (share->offset.size() == named.size() && share->total.size() == named.size()),
      "internal error: a state share of ", share ? share->offset.size() : 0, " tensors for ",
      named.size());
  for (size_t i = 0; i < named.size(); ++i) {
    const auto& [name, t] = named[i];
    const Tensor& whole = file.get(name);
    const int64_t want = share ? share->total[i] : t.numel();
    BRISK_CHECK(whole.numel() == want, "'", path, "': ", name, " holds ", whole.numel(),
                " values; this run's ", optimizer.name(), " state has ", want,
                " (another model or optim_args?)");
    const bool runs = share && !share->runs.empty();
    const Tensor src = share && !runs ? element_range(whole, share->offset[i], t.numel()) : whole;
    BRISK_CHECK(t.dtype() == DType::f32 || src.dtype() == t.dtype(), "'", path, "': ", name,
                " must be ", dtype_name(t.dtype()), ", not ", dtype_name(src.dtype()));
    // Piece by piece into wherever the state lives: no whole host copy on a GPU.
    const std::string what = name + " in " + path;  // a binding, which lambdas may not capture
    auto copy = [&](int64_t from, const Tensor& to) {
      const Tensor part = element_range(src, from, to.numel());
      if (to.dtype() == DType::f32) return copy_to_f32(part, to, what);
      std::copy_n(part.as<uint8_t>(), part.bytes(), to.as<uint8_t>());
    };
    write_in_pieces(be, t, [&](const Tensor& piece, int64_t first) {
      if (!runs) return copy(first, piece);
      for (const StateShare::Run& r : share->runs[i]) {  // the runs that meet the piece
        const int64_t begin = std::max(first, r.local);
        const int64_t end = std::min(first + piece.numel(), r.local + r.length);
        if (begin < end)
          copy(r.full + (begin - r.local), element_range(piece, begin - first, end - begin));
      }
    });
  }
  const Tensor& step = file.get("step");
  BRISK_CHECK(step.dtype() == DType::i64 && step.numel() == 1, "'", path,
              "': step must be one int64");
  BRISK_CHECK(step.as<int64_t>()[0] >= 0, "'", path, "': step is negative");
  optimizer.set_steps(step.as<int64_t>()[0]);
}

// A fault a test injects: a kill at the given point of the save sequence (counted down across
// saves). Nothing is cleaned up after it, as after a real kill: the next start finds the folders
// exactly as they were at that instant.
struct SimulatedKill : Error {
  using Error::Error;
};
void fault_point(int* countdown) {
  if (!countdown || *countdown < 0) return;
  if ((*countdown)-- == 0) {
    *countdown = -1;
    throw SimulatedKill("simulated kill while saving a checkpoint");
  }
}

void rename_or_fail(const fs::path& from, const fs::path& to) {
  std::error_code ec;
  fs::rename(from, to, ec);
  BRISK_CHECK(!ec, "cannot rename '", from.string(), "' to '", to.string(), "': ", ec.message());
}

// Checkpoint folders in output_dir with their step numbers, oldest first. Names whose number
// does not fit 18 digits are not ours and are left alone.
std::vector<std::pair<int64_t, fs::path>> list_checkpoints(const fs::path& dir) {
  std::vector<std::pair<int64_t, fs::path>> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (!e.is_directory(ec) || name.rfind("checkpoint-", 0) != 0) continue;
    const std::string num = name.substr(11);
    if (num.empty() || num.size() > 18 || !std::all_of(num.begin(), num.end(), ::isdigit)) continue;
    out.emplace_back(std::stoll(num), e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}
}  // namespace

namespace {
// The model's two files into `folder` (a fault point after each): transformers' or the adapter's.
void write_saved_model(Backend& be, const fs::path& folder, const SavedModel& m,
                       int* fail_at_point) {
  if (m.adapter) {
    const DeviceReader device = reader_for(be);
    BRISK_CHECK(m.gathered || m.weights.numel() == m.model.params().trained_run().elements.count,
                "internal error: ", m.weights.numel(), " trained weights to save for a run of ",
                m.model.params().trained_run().elements.count);
    const int64_t origin = m.model.params().trained_run().elements.offset;
    save_adapter(folder.string(), m.model, *m.adapter,
                 [&](const ParamInfo& p, size_t at, size_t n, void* dst) {
                   if (m.gathered)
                     m.gathered->read_param(p, at, n, dst);
                   else
                     device(m.weights, static_cast<size_t>(p.offset - origin) * 4 + at, n, dst);
                 });
    fault_point(fail_at_point);
    fault_point(fail_at_point);
    return;
  }
  write_model_weights(be, (folder / "model.safetensors").string(), m.model, m.weights, m.gathered);
  fault_point(fail_at_point);
  write_json(folder / "config.json", saved_config(m.model, saved_dtype(m.weights, m.gathered)));
  fault_point(fail_at_point);
}
}  // namespace

void save_model(Backend& be, const std::string& folder, const SavedModel& m) {
  write_saved_model(be, folder, m, nullptr);
}

nlohmann::json trainer_state_json(const TrainerState& state, const TrainOptions& options) {
  const std::string& best = state.best_model_checkpoint;
  const size_t dash = best.rfind('-');
  nlohmann::json best_step;  // the number of checkpoint-N
  if (!best.empty() && dash != std::string::npos)
    best_step = std::strtoll(best.c_str() + dash + 1, nullptr, 10);
  return {{"global_step", state.global_step},
          {"epoch", state.epoch},
          {"max_steps", state.max_steps},
          {"num_train_epochs", state.num_train_epochs},
          {"logging_steps", options.logging_steps},
          {"eval_steps", options.eval_steps > 0 ? options.eval_steps : options.logging_steps},
          {"save_steps", options.save_steps},
          {"train_batch_size", options.per_device_train_batch_size},
          {"total_flos", state.total_flos},
          {"best_metric", state.best_metric},
          {"best_global_step", best_step},
          {"best_model_checkpoint", best.empty() ? nlohmann::json() : nlohmann::json(best)},
          {"is_local_process_zero", true},
          {"is_world_process_zero", true},
          {"is_hyper_param_search", false},
          {"trial_name", nullptr},
          {"trial_params", nullptr},
          {"log_history", state.log_history},
          {"sample_position", state.sample_position},
          {"loss_scale", state.loss_scale},
          {"growth_tracker", state.growth_tracker}};
}

std::string save_checkpoint(Backend& be, const TrainOptions& options, const SavedModel& m,
                            const Optimizer& optimizer, const Schedule& schedule,
                            const TrainerState& state, const std::string& tokenizer_path,
                            int* fail_at_point) {
  const fs::path dir(options.output_dir);
  const fs::path final_dir = dir / ("checkpoint-" + std::to_string(state.global_step));
  const fs::path tmp_dir = dir / ("checkpoint-" + std::to_string(state.global_step) + ".tmp-" +
                                  std::to_string(::getpid()));
  std::error_code ec;
  fs::remove_all(tmp_dir, ec);
  fs::create_directories(tmp_dir, ec);
  BRISK_CHECK(!ec, "cannot create checkpoint folder '", tmp_dir.string(), "': ", ec.message());
  try {
    write_saved_model(be, tmp_dir, m, fail_at_point);
    write_optimizer_state(be, optimizer, (tmp_dir / "optimizer.safetensors").string(), m.gathered);
    fault_point(fail_at_point);
    write_json(tmp_dir / "scheduler.json", {{"lr_scheduler_type", schedule.type},
                                            {"warmup_steps", schedule.warmup_steps},
                                            {"total_steps", schedule.total_steps},
                                            {"last_step", state.global_step}});
    fault_point(fail_at_point);
    write_json(tmp_dir / "trainer_state.json", trainer_state_json(state, options));
    fault_point(fail_at_point);
    write_json(tmp_dir / "training_args.json", options_to_json(options));
    if (!tokenizer_path.empty()) copy_tokenizer_files(tokenizer_path, tmp_dir.string());
    fault_point(fail_at_point);
    // The rename is the commit point. A checkpoint of the same step saved earlier is moved
    // aside first and deleted only after the new one is in place, so at every instant one
    // complete copy exists under a name remove_interrupted_saves knows.
    const fs::path old_dir = dir / ("checkpoint-" + std::to_string(state.global_step) + ".old-" +
                                    std::to_string(::getpid()));
    const bool replacing = fs::exists(final_dir, ec);
    if (replacing) {
      rename_or_fail(final_dir, old_dir);
      fault_point(fail_at_point);
    }
    rename_or_fail(tmp_dir, final_dir);
    if (replacing) {
      fault_point(fail_at_point);
      fs::remove_all(old_dir, ec);
    }
  } catch (const SimulatedKill&) {
    throw;
  } catch (...) {
    fs::remove_all(tmp_dir, ec);
    throw;
  }
  if (options.save_total_limit > 0) {
    auto all = list_checkpoints(dir);
    // As transformers rotates: the best checkpoint moves next to the newest, so it goes last;
    // with a limit of 1 it is kept beside the newest.
    size_t limit = static_cast<size_t>(options.save_total_limit);
    const auto best = std::find_if(all.begin(), all.end(), [&](const auto& c) {
      return !state.best_model_checkpoint.empty() &&
             c.second == fs::path(state.best_model_checkpoint);
    });
    if (best != all.end() && best + 1 != all.end()) {
      std::rotate(best, best + 1, all.end() - 1);
      if (limit == 1) limit = 2;
    }
    // Renamed out of the checkpoint namespace before deletion: a kill in between leaves a
    // .del- folder that the next start removes, never a half-deleted checkpoint-N.
    for (size_t i = 0; i + limit < all.size(); ++i) {
      const fs::path doomed = all[i].second.string() + ".del-" + std::to_string(::getpid());
      fs::rename(all[i].second, doomed, ec);
      if (!ec) fault_point(fail_at_point);
      fs::remove_all(ec ? all[i].second : doomed, ec);
    }
  }
  return final_dir.string();
}

namespace {
// The lock file's text: "PID HOST", read back for the message of a run refused. A holder that
// has locked but not written it yet is given a moment.
std::string lock_holder(int fd) {
  for (int attempt = 0; attempt < 20; ++attempt) {
    char text[300] = {};
    const ssize_t n = ::pread(fd, text, sizeof text - 1, 0);
    const std::string s(text, n > 0 ? static_cast<size_t>(n) : 0);
    const size_t space = s.find(' ');
    if (space != std::string::npos && s.back() == '\n')
      return "PID " + s.substr(0, space) + " on host " +
             excerpt(s.substr(space + 1, s.size() - space - 2));
    ::usleep(10000);
  }
  return "PID unknown";
}

// Whether `fd` is still the file at `path`: a run that ended unlinks it, and a lock taken on the
// unlinked file would exclude nobody.
bool is_current(int fd, const std::string& path) {
  struct stat held = {};
  struct stat named = {};
  return ::fstat(fd, &held) == 0 && ::stat(path.c_str(), &named) == 0 &&
         held.st_dev == named.st_dev && held.st_ino == named.st_ino;
}
}  // namespace

OutputDirLock::OutputDirLock(const std::string& output_dir)
    : dir_(output_dir), path_((fs::path(output_dir) / ".brisk-run.lock").string()) {
  std::error_code ec;
  created_ = fs::create_directories(dir_, ec);
  BRISK_CHECK(!ec && fs::is_directory(dir_), "cannot create output_dir '", dir_,
              "': ", ec ? ec.message() : "not a folder");
  BRISK_CHECK(::access(dir_.c_str(), W_OK) == 0, "output_dir '", dir_, "' is not writable");
  for (;;) {
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    BRISK_CHECK(fd_ >= 0, "cannot create the lock file '", path_, "': ", std::strerror(errno));
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      const std::string holder = err == EWOULDBLOCK ? lock_holder(fd_) : "";
      ::close(fd_);
      fd_ = -1;
      BRISK_CHECK(err != EWOULDBLOCK, "output_dir '", dir_, "' is in use by another run (", holder,
                  "); give another --output_dir, or wait for that run to end");
      BRISK_FAIL("cannot lock '", path_, "': ", std::strerror(err));
    }
    if (is_current(fd_, path_)) break;
    ::close(fd_);  // the run holding it ended meanwhile: lock the file now there
  }
  char host[256] = "localhost";
  ::gethostname(host, sizeof host - 1);
  const std::string text = std::to_string(::getpid()) + " " + host + "\n";
  // Best effort: the text only names the holder in another run's message.
  if (::ftruncate(fd_, 0) == 0) {
    [[maybe_unused]] const ssize_t written = ::pwrite(fd_, text.data(), text.size(), 0);
  }
}

OutputDirLock::~OutputDirLock() {
  ::unlink(path_.c_str());  // while still locked: a run starting now locks a new file
  ::close(fd_);
  if (created_) ::rmdir(dir_.c_str());  // only when empty: a run that failed at start
}

SaveCleanup remove_interrupted_saves(const OutputDirLock& lock) {
  SaveCleanup cleanup;
  const std::string& output_dir = lock.dir();
  std::error_code ec;
  std::vector<fs::path> entries;  // listed first: the loop renames and removes
  for (const auto& e : fs::directory_iterator(output_dir, ec))
    if (e.is_directory(ec)) entries.push_back(e.path());
  for (const fs::path& path : entries) {
    const std::string name = path.filename().string();
    size_t mark = std::string::npos;
    for (const char* tag : {".tmp-", ".old-", ".del-"}) mark = std::min(mark, name.find(tag));
    if (name.rfind("checkpoint-", 0) != 0 || mark == std::string::npos) continue;
    const std::string step = name.substr(11, mark - 11), pid = name.substr(mark + 5);
    auto digits = [](const std::string& t) {
      return !t.empty() && std::all_of(t.begin(), t.end(), ::isdigit);
    };
    if (!digits(step) || !digits(pid)) continue;
    // A previous copy moved aside by a save that was interrupted before its new copy was in
    // place is the step's only complete checkpoint: it goes back.
    const fs::path final_dir = fs::path(output_dir) / ("checkpoint-" + step);
    if (name[mark + 1] == 'o' && !fs::exists(final_dir, ec)) {
      fs::rename(path, final_dir, ec);
      BRISK_CHECK(
          !ec, "cannot put '", path.string(), "' back as checkpoint-", step,
          " (the step's only complete copy, moved aside by an interrupted save): ", ec.message());
      cleanup.done.push_back(name + " (restored as checkpoint-" + step + ")");
      continue;
    }
    fs::remove_all(path, ec);
    if (ec)
      cleanup.failed.push_back("cannot remove the interrupted save '" + path.string() +
                               "': " + ec.message());
    else
      cleanup.done.push_back(name);
  }
  return cleanup;
}

std::string last_checkpoint(const std::string& output_dir) {
  const auto all = list_checkpoints(output_dir);
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    if (!checkpoint_lacks(it->second)) return it->second.string();
  }
  BRISK_FAIL("--resume_from_checkpoint last: output_dir '", output_dir,
             "' holds no complete checkpoint");
}

namespace {
// Refuses a checkpoint transformers' Trainer wrote (its optimizer and arguments pickled by
// PyTorch), saying what can be done with it instead.
void refuse_trainer_checkpoint(const fs::path& dir) {
  std::error_code ec;
  const bool trainer = fs::exists(dir / "optimizer.pt", ec) ||
                       fs::exists(dir / "training_args.bin", ec) ||
                       fs::exists(dir / "scheduler.pt", ec);
  BRISK_CHECK(!trainer || fs::exists(dir / "optimizer.safetensors", ec), "checkpoint '",
              dir.string(),
              "' was written by transformers' Trainer: brisk cannot read PyTorch's pickled "
              "optimizer state (optimizer.pt); give the folder as --model_name_or_path to train "
              "on from its weights with a new optimizer state, or resume it with Trainer");
}
}  // namespace

uint64_t checkpoint_seed(const std::string& folder) {
  refuse_trainer_checkpoint(folder);
  const fs::path args = fs::path(folder) / "training_args.json";
  BRISK_CHECK(fs::exists(args), "checkpoint '", folder,
              "' is incomplete: training_args.json is missing");
  const nlohmann::json j = read_json(args);
  BRISK_CHECK(j.contains("seed") && j["seed"].is_number_unsigned(), "checkpoint '", folder,
              "': training_args.json has no seed");
  return j["seed"].get<uint64_t>();
}

TrainerState parse_trainer_state(const nlohmann::json& ts, const std::string& where) {
  TrainerState state;
  BRISK_CHECK(ts.is_object(), where, " is not a JSON object");
  // Every value is checked before use: a position or step out of range would read outside the
  // data order or run (almost) forever; a bad loss scale would poison fp16 training.
  auto count = [&](const char* key, bool required) -> int64_t {
    if (!ts.contains(key)) {
      BRISK_CHECK(!required, where, " lacks \"", key, "\"");
      return 0;
    }
    const nlohmann::json& v = ts[key];
    BRISK_CHECK(
        v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() < (int64_t{1} << 53),
        where, ": \"", key, "\" must be a whole number from 0 to 2^53");
    return v.get<int64_t>();
  };
  auto real = [&](const char* key, double fallback, double low, double high) -> double {
    if (!ts.contains(key)) return fallback;
    const nlohmann::json& v = ts[key];
    BRISK_CHECK(v.is_number() && v.get<double>() >= low && v.get<double>() <= high, where, ": \"",
                key, "\" must be a number from ", low, " to ", high);
    return v.get<double>();
  };
  state.global_step = count("global_step", true);
  // Checkpoints before sample positions hold the micro-batches consumed instead.
  const bool legacy = !ts.contains("sample_position") && ts.contains("micro_batches");
  if (legacy) state.legacy_micro_batches = count("micro_batches", true);
  if (!legacy) state.sample_position = count("sample_position", true);
  state.epoch = real("epoch", 0.0, 0.0, 1e12);  // the bound --num_train_epochs has
  state.total_flos = real("total_flos", 0.0, 0.0, 1e300);
  // fp16's scaler: a scale above 2^64 would overflow every step until halved ~50 times.
  state.loss_scale = real("loss_scale", 1.0, 1e-30, 18446744073709551616.0);
  state.growth_tracker = count("growth_tracker", false);
  // Every step consumes at least one sample (and one micro-batch).
  const int64_t position = legacy ? state.legacy_micro_batches : state.sample_position;
  BRISK_CHECK(position >= state.global_step, where, ": ",
              legacy ? "micro_batches " : "sample_position ", position,
              " is fewer than global_step ", state.global_step);
  const nlohmann::json history = ts.value("log_history", nlohmann::json::array());
  BRISK_CHECK(
      history.is_array() && std::all_of(history.begin(), history.end(),
                                        [](const nlohmann::json& r) { return r.is_object(); }),
      where, ": \"log_history\" must be a list of records");
  state.log_history = history;
  if (ts.contains("best_metric") && !ts["best_metric"].is_null()) {
    BRISK_CHECK(ts["best_metric"].is_number() && std::isfinite(ts["best_metric"].get<double>()),
                where, ": \"best_metric\" must be a finite number or null");
    state.best_metric = ts["best_metric"].get<double>();
  }
  if (ts.contains("best_model_checkpoint") && !ts["best_model_checkpoint"].is_null()) {
    const nlohmann::json& b = ts["best_model_checkpoint"];
    BRISK_CHECK(
        b.is_string() && !b.get<std::string>().empty() && b.get<std::string>().size() <= 4096,
        where, ": \"best_model_checkpoint\" must be a folder name or null");
    state.best_model_checkpoint = b.get<std::string>();
  }
  return state;
}

void load_checkpoint(Backend& be, const std::string& folder, const TrainOptions& options,
                     Model& model, Optimizer& optimizer, TrainerState& state,
                     const StateShare* share) {
  const fs::path dir(folder);
  BRISK_CHECK(fs::is_directory(dir), "checkpoint folder '", folder, "' does not exist");
  refuse_trainer_checkpoint(dir);
  const char* lacks = checkpoint_lacks(dir);
  BRISK_CHECK(!lacks, "checkpoint '", folder, "' is incomplete: ", lacks, " is missing");
  const bool adapter = !missing_file(dir, kAdapterFiles) && missing_file(dir, kModelFiles);
  BRISK_CHECK(adapter == (model.adapters() != nullptr), "checkpoint '", folder, "' holds ",
              adapter ? "a LoRA adapter; resume it with --use_peft" : "a whole model",
              adapter ? "" : "; resume it without --use_peft or --adapter_name_or_path");
  if (adapter)
    load_adapter(be, model, SafetensorsFile((dir / "adapter_model.safetensors").string()));
  else
    model.load_weights(be, WeightFiles((dir / "model.safetensors").string()));
  const nlohmann::json args = read_json(dir / "training_args.json");
  const std::string saved = args.value("optim", std::string("adamw_torch"));
  BRISK_CHECK(canonical_optimizer_name(saved) == optimizer.name(), "checkpoint '", folder,
              "' holds the state of optimizer ", saved, "; this run uses ", options.optim,
              " (resume with the same --optim)");
  read_optimizer_state(be, (dir / "optimizer.safetensors").string(), optimizer, share);
  state = parse_trainer_state(read_json(dir / "trainer_state.json"),
                              "checkpoint '" + folder + "': trainer_state.json");
}

}  // namespace brisk
