#include "shm.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <ctime>

namespace ncclemu {

void futexWait(std::atomic<uint32_t>* word, uint32_t expected, int timeout_ms) {
  futexWaitFor(word, expected, std::chrono::milliseconds(timeout_ms));
}

void futexWaitFor(std::atomic<uint32_t>* word, uint32_t expected, std::chrono::nanoseconds timeout) {
  const int64_t ns = std::max<int64_t>(0, timeout.count());
  timespec relative{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &relative, nullptr, 0);
}

void futexWakeAll(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
}

SharedSegment::~SharedSegment() {
  if (base_) munmap(base_, size_);
}

int SharedSegment::map(const std::string& name, size_t size, Open mode) {
  int flags = O_RDWR;
  if (mode == Open::Create) flags |= O_CREAT;
  if (mode == Open::CreateExclusive) flags |= O_CREAT | O_EXCL;
  const int fd = shm_open(name.c_str(), flags, 0600);
  if (fd < 0) return errno;
  // Every opener sizes the segment to the same size, so the order of arrival does not matter.
  if (mode != Open::Existing && ftruncate(fd, static_cast<off_t>(size)) != 0) {
    const int error = errno;
    close(fd);
    return error;
  }
  // A segment whose creator has not sized it yet would fault on first touch: come back later.
  struct stat status {};
  if (mode == Open::Existing && (fstat(fd, &status) != 0 || static_cast<size_t>(status.st_size) < size)) {
    close(fd);
    return EAGAIN;
  }
  void* base = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int error = errno;
  close(fd);
  if (base == MAP_FAILED) return error;
  base_ = base;
  size_ = size;
  return 0;
}

}  // namespace ncclemu
