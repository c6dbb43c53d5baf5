// Input files (see input_file.h).
#include "core/input_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"
#include "core/json_file.h"

namespace brisk {

InputFile::InputFile(const std::string& path, const std::string& what) : path_(path), what_(what) {
  // O_NONBLOCK: opening a FIFO returns at once instead of waiting for a writer.
  fd_ = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  BRISK_CHECK(fd_ >= 0, "cannot open ", what, " '", path, "': ", std::strerror(errno));
  struct stat st {};
  const bool stat_ok = ::fstat(fd_, &st) == 0;
  if (!stat_ok || !S_ISREG(st.st_mode)) {
    ::close(fd_);
    fd_ = -1;
    BRISK_FAIL(what, " '", path, "' is not a regular file",
               !stat_ok                                     ? ""
               : S_ISDIR(st.st_mode)                        ? " (a folder)"
               : S_ISFIFO(st.st_mode)                       ? " (a FIFO)"
               : S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode) ? " (a device)"
                                                            : "");
  }
  size_ = static_cast<size_t>(st.st_size);
  // Reads of a regular file block as usual (O_NONBLOCK changes nothing for them; cleared anyway).
  ::fcntl(fd_, F_SETFL, ::fcntl(fd_, F_GETFL) & ~O_NONBLOCK);
}

InputFile::~InputFile() {
  if (fd_ >= 0) ::close(fd_);
}

std::string InputFile::read_all(size_t max_bytes) const {
  BRISK_CHECK(size_ <= max_bytes, what_, " '", path_, "' is larger than ", format_mib(max_bytes));
  std::string text(size_, '\0');
  size_t done = 0;
  while (done < size_) {
    const ssize_t n = ::read(fd_, text.data() + done, size_ - done);
    if (n < 0 && errno == EINTR) continue;
    BRISK_CHECK(n > 0, "cannot read ", what_, " '", path_, "'",
                n < 0 ? std::string(": ") + std::strerror(errno) : std::string(": it shrank"));
    done += static_cast<size_t>(n);
  }
  return text;
}

}  // namespace brisk
