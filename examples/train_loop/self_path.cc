#include "self_path.h"

#include <limits.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

std::string executable_path() {
  char buffer[PATH_MAX];
  const ssize_t length = readlink("/proc/self/exe", buffer, sizeof buffer);
  if (length <= 0 || length == static_cast<ssize_t>(sizeof buffer)) {
    std::perror("train_loop: readlink(/proc/self/exe)");
    std::exit(EXIT_FAILURE);
  }
  return std::string(buffer, static_cast<size_t>(length));
}

std::string executable_directory() {
  const std::string path = executable_path();
  return path.substr(0, path.rfind('/'));
}
