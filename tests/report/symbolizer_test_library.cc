// A shared library with symbols that only its full symbol table (.symtab) names: a static function
// and a global one of hidden visibility. Its exported functions hand out their addresses.
#include <cstdint>

extern "C" {

static int ncclguard_symbolizer_static_in_library(int value) { return value * 3 + 1; }

__attribute__((visibility("hidden"))) int ncclguard_symbolizer_hidden_in_library(int value) {
  return value * 5 + 2;
}

__attribute__((visibility("default"))) const void* ncclguard_symbolizer_library_static_address() {
  return reinterpret_cast<const void*>(&ncclguard_symbolizer_static_in_library);
}

__attribute__((visibility("default"))) const void* ncclguard_symbolizer_library_hidden_address() {
  return reinterpret_cast<const void*>(&ncclguard_symbolizer_hidden_in_library);
}

}  // extern "C"
