#include "cli/elf_exports.h"

#include <elf.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace ncclguard {
namespace {

// A read-only mapping of a whole file, unmapped when it goes.
class MappedFile {
 public:
  explicit MappedFile(const std::string& path) {
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return;
    struct stat info = {};
    if (fstat(fd, &info) == 0 && S_ISREG(info.st_mode) && info.st_size > 0) {
      void* data = mmap(nullptr, static_cast<size_t>(info.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
      if (data != MAP_FAILED) {
        data_ = static_cast<const unsigned char*>(data);
        size_ = static_cast<size_t>(info.st_size);
      }
    }
    close(fd);
  }
  ~MappedFile() {
    if (data_ != nullptr) munmap(const_cast<unsigned char*>(data_), size_);
  }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  // A T at `offset` (as many as `count`) when the file holds it all; nullptr otherwise.
  template <typename T>
  const T* At(std::uint64_t offset, std::uint64_t count = 1) const {
    if (data_ == nullptr || offset > size_ || count > (size_ - offset) / sizeof(T)) return nullptr;
    return reinterpret_cast<const T*>(data_ + offset);
  }
  size_t size() const { return size_; }

 private:
  const unsigned char* data_ = nullptr;
  size_t size_ = 0;
};

// The NUL-terminated name at `offset` of a string table, when it lies within the table.
std::string_view NameAt(const MappedFile& file, const Elf64_Shdr& table, std::uint32_t offset) {
  const char* strings = file.At<char>(table.sh_offset, table.sh_size);
  if (strings == nullptr || offset >= table.sh_size) return {};
  const void* end = std::memchr(strings + offset, '\0', table.sh_size - offset);
  return end == nullptr ? std::string_view() : std::string_view(strings + offset);
}

}  // namespace

absl::Status CheckExportsSymbol(const std::string& path, const std::string& symbol) {
  const MappedFile file(path);
  const Elf64_Ehdr* header = file.At<Elf64_Ehdr>(0);
  if (header == nullptr || std::memcmp(header->e_ident, ELFMAG, SELFMAG) != 0 ||
      header->e_ident[EI_CLASS] != ELFCLASS64) {
    return absl::InvalidArgumentError("is not a 64-bit ELF file");
  }
  if (header->e_type != ET_DYN) return absl::InvalidArgumentError("is not an ELF shared object");
  const Elf64_Shdr* sections = header->e_shentsize == sizeof(Elf64_Shdr)
                                   ? file.At<Elf64_Shdr>(header->e_shoff, header->e_shnum)
                                   : nullptr;
  for (std::uint16_t i = 0; sections != nullptr && i < header->e_shnum; ++i) {
    const Elf64_Shdr& table = sections[i];
    if (table.sh_type != SHT_DYNSYM || table.sh_link >= header->e_shnum) continue;
    const Elf64_Sym* symbols = file.At<Elf64_Sym>(table.sh_offset, table.sh_size / sizeof(Elf64_Sym));
    for (std::uint64_t s = 0; symbols != nullptr && s < table.sh_size / sizeof(Elf64_Sym); ++s) {
      if (symbols[s].st_shndx != SHN_UNDEF &&
          NameAt(file, sections[table.sh_link], symbols[s].st_name) == symbol) {
        return absl::OkStatus();
      }
    }
  }
  return absl::NotFoundError(absl::StrCat("does not export ", symbol));
}

}  // namespace ncclguard
