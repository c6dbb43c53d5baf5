// TensorBoard event files (--report_to tensorboard): TFRecord framing (length, masked CRC-32C,
// data, masked CRC-32C) around Event protocol buffers holding scalar and text summaries, the format
// TensorBoard and torch's SummaryWriter use. Log records are mapped to tags as transformers'
// TensorBoardCallback maps them: "eval_loss" -> "eval/loss", "loss" -> "train/loss".
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

namespace brisk {

// The file holds whole records only, whatever happens to the disk: each record goes to the file in
// one write, and a write that fails or falls short (a full disk, a file-size limit) is cut back
// to the last whole record, after which the writer takes no more (the run goes on without its
// events) and take_warning() has the warning, once. A file left without any record is removed.
class EventWriter {
 public:
  // Opens `path` (failing, naming it, when it cannot) and writes the file-version event stamped
  // `wall_time`.
  EventWriter(const std::string& path, double wall_time);
  ~EventWriter();
  EventWriter(const EventWriter&) = delete;
  EventWriter& operator=(const EventWriter&) = delete;

  void scalar(const std::string& tag, float value, int64_t step, double wall_time);
  // A text summary (TensorBoard's text plugin), as transformers writes "args" and
  // "model_config".
  void text(const std::string& tag, const std::string& text, int64_t step, double wall_time);
  // Every numeric entry of a log record but its step and epoch bookkeeping, at `step`.
  void log(const nlohmann::json& record, int64_t step, double wall_time);
  // The warning of the write that stopped the events, the first time it is asked; else "".
  std::string take_warning();
  bool stopped() const { return stopped_; }
  const std::string& path() const { return path_; }

 private:
  void record(const std::string& data);
  void stop(int err);
  std::string path_;
  int fd_ = -1;
  uint64_t whole_bytes_ = 0;  // the whole records written so far
  int64_t records_ = 0;
  bool stopped_ = false;
  std::string warning_;
};

// A new event file's path in `dir`: events.out.tfevents.<seconds>.<host>.<pid>.0, as
// SummaryWriter names it.
std::string event_file_path(const std::string& dir, double wall_time);

// CRC-32C (Castagnoli) of `n` bytes, and the masked form TFRecord stores. crc32c uses the
// SSE4.2 instruction on x86-64 CPUs that have it (crc32c_in_hardware), else crc32c_software: a
// table-driven version for any CPU, with the same values.
uint32_t crc32c(const void* data, size_t n);
bool crc32c_in_hardware();
uint32_t crc32c_software(const void* data, size_t n);
uint32_t masked_crc32c(const void* data, size_t n);

}  // namespace brisk
