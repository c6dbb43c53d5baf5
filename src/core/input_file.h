// Input files opened without blocking on what is not a regular file: a FIFO, a device, a folder
// or a symlink to one is refused by name before anything waits on it (opening a FIFO for
// reading blocks until a writer comes, for ever if none does).
#pragma once

#include <cstddef>
#include <string>

namespace brisk {

class InputFile {
 public:
  // Opens `path` for reading; `what` names it in messages ("data file", "weights file", ...).
  InputFile(const std::string& path, const std::string& what);
  ~InputFile();
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;
  int fd() const { return fd_; }
  size_t size() const { return size_; }
  // The whole file, refused when larger than `max_bytes`.
  std::string read_all(size_t max_bytes) const;

 private:
  std::string path_, what_;
  int fd_ = -1;
  size_t size_ = 0;
};

}  // namespace brisk
