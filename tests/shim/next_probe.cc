// dlsym(RTLD_NEXT, ...) from a library must keep meaning "the next definition after that library"
// when ncclguard's dlsym() sits in front of glibc's. The program links two libraries that both
// define next_probe_name(); the first asks for the next one and must get the second's.
#include <dlfcn.h>

#include <cstdio>

#if defined(NEXT_PROBE_FIRST)
extern "C" __attribute__((visibility("default"))) const char* next_probe_name() { return "first"; }
extern "C" __attribute__((visibility("default"))) const char* next_probe_call_next() {
  auto next = reinterpret_cast<const char* (*)()>(dlsym(RTLD_NEXT, "next_probe_name"));
  return next != nullptr ? next() : "none";
}
#elif defined(NEXT_PROBE_SECOND)
extern "C" __attribute__((visibility("default"))) const char* next_probe_name() { return "second"; }
extern "C" __attribute__((visibility("default"))) int next_probe_second_linked() { return 1; }
#else
extern "C" const char* next_probe_call_next();
extern "C" int next_probe_second_linked();  // keeps the second library NEEDED under --as-needed
int main() {
  if (next_probe_second_linked() != 1) return 1;
  std::printf("next %s\n", next_probe_call_next());
  return 0;
}
#endif
