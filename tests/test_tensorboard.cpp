// TensorBoard event files byte for byte as tensorboard's own writer frames and serializes them
// (tests/fixtures/tensorboard/reference.tfevents, from scripts/make_tensorboard_fixture.py).
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "report/tensorboard.h"
#include "test_support.h"
#include "train/trainer.h"
#include "trainer_support.h"

namespace brisk::testing {
namespace {

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(TensorBoard, EventsEqualTensorBoardsOwnWriter) {
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("brisk_tb_" + std::to_string(::getpid()) + ".tfevents"))
                               .string();
  {
    EventWriter w(path, 1700000000.0);
    w.scalar("train/loss", 0.6931471805599453f, 1, 1700000001.25);
    w.log({{"learning_rate", 5e-05}, {"step", 1}, {"skipped", false}}, 1, 1700000001.25);
    w.log({{"eval_accuracy", 0.875}}, 2, 1700000002.5);
    w.scalar("train/grad_norm", -1.5e-30f, 1000000000000, 1700000003.0);
  }
  const std::string want = slurp(fixture("tensorboard/reference.tfevents"));
  ASSERT_FALSE(want.empty());
  EXPECT_EQ(slurp(path), want);
  std::remove(path.c_str());
}

// Text summaries as SummaryWriter.add_text writes them (transformers' "args" and
// "model_config"): tests/fixtures/tensorboard/reference_text.tfevents.
TEST(TensorBoard, TextSummariesEqualTensorBoardsOwnWriter) {
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("brisk_tb_text_" + std::to_string(::getpid()) + ".tfevents"))
                               .string();
  {
    EventWriter w(path, 1700000000.0);
    w.text("args", "{\n  \"learning_rate\": 5e-05\n}", 0, 1700000001.5);
    w.text("model_config", "caf\xc3\xa9 " + std::string(300, 'x'), 7, 1700000002.0);
  }
  const std::string want = slurp(fixture("tensorboard/reference_text.tfevents"));
  ASSERT_FALSE(want.empty());
  EXPECT_EQ(slurp(path), want);
  std::remove(path.c_str());
}

TEST(TensorBoard, Crc32cGivesTheKnownValuesInHardwareAndSoftware) {
  // RFC 3720's test vectors for CRC-32C.
  const std::string zeros(32, '\0'), ones(32, '\xff');
  for (auto* crc : {&crc32c, &crc32c_software}) {
    EXPECT_EQ(crc(zeros.data(), zeros.size()), 0x8a9136aau);
    EXPECT_EQ(crc(ones.data(), ones.size()), 0x62a8ab43u);
    EXPECT_EQ(crc("123456789", 9), 0xe3069283u);
    EXPECT_EQ(crc("", 0), 0u);
  }
  // Every length and start around the hardware path's 8-byte words.
  std::string bytes(64, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i * 37 + 11);
  for (size_t at = 0; at < 8; ++at)
    for (size_t n = 0; at + n <= bytes.size(); ++n)
      EXPECT_EQ(crc32c(bytes.data() + at, n), crc32c_software(bytes.data() + at, n)) << at << n;
#if defined(__x86_64__)
  // The hardware path was the one compared: the x86-64 levels brisk builds for include SSE4.2.
  EXPECT_TRUE(crc32c_in_hardware());
#endif
}

// A run with --report_to tensorboard leaves one event file in logging_dir whose every record is
// framed with valid checksums and whose tags are transformers' (train/loss, eval/loss, args, ...).
// The whole records at the start of an event file (each framed with valid checksums), and whether
// they are all it holds.
struct Records {
  int count = 0;
  bool whole = true;
};
Records whole_records(const std::string& data) {
  Records r;
  for (size_t at = 0; at < data.size();) {
    uint64_t len = 0;
    uint32_t crc = 0;
    if (at + 12 > data.size()) return {r.count, false};
    std::memcpy(&len, data.data() + at, 8);
    std::memcpy(&crc, data.data() + at + 8, 4);
    if (crc != masked_crc32c(data.data() + at, 8) || len > data.size() - at - 16)
      return {r.count, false};
    std::memcpy(&crc, data.data() + at + 12 + len, 4);
    if (crc != masked_crc32c(data.data() + at + 12, len)) return {r.count, false};
    at += 12 + len + 4;
    ++r.count;
  }
  return r;
}

TEST(TensorBoard, ATrainingRunReportsItsLogs) {
  TempDir dir("tb_run");
  TrainOptions o = tiny_options(write_config(dir, "gpt2", 0.0), dir / "out");
  o.report_to = "tensorboard";
  o.logging_dir = dir / "tb";
  o.logging_steps = 2;
  o.eval_strategy = "steps";
  o.eval_dataset_size = 8;
  train(o, [](const nlohmann::json&) {});
  std::vector<std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(o.logging_dir))
    files.push_back(e.path().string());
  ASSERT_EQ(files.size(), 1u);
  EXPECT_NE(files[0].find("events.out.tfevents."), std::string::npos);
  const std::string data = slurp(files[0]);
  size_t at = 0;
  int records = 0;
  while (at < data.size()) {
    ASSERT_LE(at + 12, data.size());
    uint64_t len;
    std::memcpy(&len, data.data() + at, 8);
    uint32_t crc;
    std::memcpy(&crc, data.data() + at + 8, 4);
    EXPECT_EQ(crc, masked_crc32c(data.data() + at, 8));
    ASSERT_LE(at + 12 + len + 4, data.size());
    std::memcpy(&crc, data.data() + at + 12 + len, 4);
    EXPECT_EQ(crc, masked_crc32c(data.data() + at + 12, len));
    at += 12 + len + 4;
    ++records;
  }
  EXPECT_GT(records, 10);
  // As transformers' TensorBoardCallback: the arguments and the model's config as text, and
  // the run's final metrics.
  for (const char* tag : {"train/loss", "train/learning_rate", "eval/loss", "eval/perplexity",
                          "args", "model_config", "train/train_runtime", "train/train_loss"})
    EXPECT_NE(data.find(tag), std::string::npos) << tag;
}

}  // namespace
}  // namespace brisk::testing

namespace brisk::testing {
namespace {

// A full disk, as a file-size limit makes one without root (RLIMIT_FSIZE in a child, SIGXFSZ
// ignored, so writes fail with EFBIG or fall short): the file keeps only whole records (none: no
// file), the writer warns once and takes no more.
TEST(TensorBoard, AFullDiskLeavesWholeRecordsAndOneWarning) {
  TempDir dir("tb_full");
  // The file-version record takes 40 bytes; a scalar about 40 more.
  for (const rlim_t limit : {rlim_t{0}, rlim_t{20}, rlim_t{100}, rlim_t{1000}}) {
    const std::string path = dir / ("limit_" + std::to_string(limit) + ".tfevents");
    const pid_t child = ::fork();
    if (child == 0) {
      const struct rlimit small = {limit, limit};
      ::signal(SIGXFSZ, SIG_IGN);
      if (::setrlimit(RLIMIT_FSIZE, &small) != 0) ::_exit(2);
      int warnings = 0;
      bool named = true;
      EventWriter w(path, 1700000000.0);
      for (int step = 1; step <= 100; ++step) {
        w.scalar("train/loss", 0.5f, step, 1700000001.0);
        const std::string warning = w.take_warning();
        named = named && (warning.empty() || warning.find(path) != std::string::npos);
        warnings += warning.empty() ? 0 : 1;
      }
      ::_exit(warnings == 1 && named && w.stopped() ? 0 : 10 + warnings);
    }
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFEXITED(status)) << "limit " << limit << ": the child died of a signal";
    EXPECT_EQ(WEXITSTATUS(status), 0) << "limit " << limit << ": warnings + 10, or 2";
    std::error_code ec;
    if (limit < 40) {
      EXPECT_FALSE(std::filesystem::exists(path, ec)) << "limit " << limit << ": an empty file";
      continue;
    }
    const std::string data = slurp(path);
    const Records r = whole_records(data);
    EXPECT_TRUE(r.whole) << "limit " << limit << ": cut after " << r.count << " records";
    EXPECT_GE(r.count, 1) << limit;
    EXPECT_LE(data.size(), limit);
    EXPECT_GT(data.size() + 80, limit) << "stopped long before the disk was full";
  }
}

// A run on a full disk: the events stop with one warning record and the file keeps whole
// records, while the checkpoint's weights, which cannot be written either, end the run with an
// error naming the file.
TEST(TensorBoard, ARunOnAFullDiskWarnsOnceForItsEventsAndFailsItsSave) {
  TempDir dir("tb_full_run");
  const std::string out = dir / "stdout.txt", err = dir / "stderr.txt", tb = dir / "tb";
  // bash's ulimit -f counts 1024-byte blocks: the events' first records fit, the options' text
  // and the weights do not.
  const std::string cmd = "trap '' XFSZ; ulimit -f 1; exec timeout 60 " +
                          std::string(BRISK_BINARY) + " train --model bert-tiny --max_steps 4" +
                          " --seq_len 8 --dataset_size 16 --save_steps 2 --disable_tqdm" +
                          " --report_to tensorboard --logging_dir " + tb + " --output_dir " +
                          (dir / "out") + " > " + out + " 2> " + err + " < /dev/null";
  const int status = std::system(("bash -c \"" + cmd + "\"").c_str());
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 1);
  const std::string errors = slurp(err), log = slurp(out);
  EXPECT_EQ(errors.rfind("brisk: error: failed while writing '", 0), 0u) << errors;
  EXPECT_NE(errors.find("model.safetensors"), std::string::npos) << errors;
  EXPECT_EQ(std::count(errors.begin(), errors.end(), '\n'), 1) << errors;
  size_t warnings = 0;
  for (size_t at = log.find("{\"warning\":\"TensorBoard events stopped"); at != std::string::npos;
       at = log.find("{\"warning\":\"TensorBoard events stopped", at + 1))
    ++warnings;
  EXPECT_EQ(warnings, 1u) << log;
  std::vector<std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(tb)) files.push_back(e.path().string());
  ASSERT_EQ(files.size(), 1u);
  const Records r = whole_records(slurp(files[0]));
  EXPECT_TRUE(r.whole);
  EXPECT_GE(r.count, 1);
}

}  // namespace
}  // namespace brisk::testing
