#include "watchdog/common/exit_gate.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

namespace ncclguard {
namespace {

// Sequentially consistent, both: a holder adds itself and then looks at the gate, the closer
// closes it and then counts the holders, so at least one of them sees the other.
std::atomic<bool> g_closed{false};
std::atomic<int> g_holders{0};
thread_local int t_depth = 0;  // passes the thread holds
thread_local bool t_own_thread = false;

[[noreturn]] void Park() noexcept {
  // ncclguard's threads run with every signal blocked; pause() is a system call, which the
  // process's end interrupts for good.
  for (;;) pause();
}

}  // namespace

ExitPass::ExitPass() noexcept {
  g_holders.fetch_add(1, std::memory_order_seq_cst);
  if (g_closed.load(std::memory_order_seq_cst)) {
    if (t_own_thread) {
      g_holders.fetch_sub(1 + t_depth, std::memory_order_seq_cst);
      Park();
    }
    // The application's thread inside a pass already goes on: the closer waits for it.
    if (t_depth == 0) {
      g_holders.fetch_sub(1, std::memory_order_seq_cst);
      return;
    }
  }
  ++t_depth;
  open_ = true;
}

ExitPass::~ExitPass() {
  if (!open_) return;
  --t_depth;
  g_holders.fetch_sub(1, std::memory_order_seq_cst);
}

void MarkOwnThread() noexcept { t_own_thread = true; }

bool IsOwnThread() noexcept { return t_own_thread; }

bool CloseExitGate(std::chrono::milliseconds deadline) noexcept {
  g_closed.store(true, std::memory_order_seq_cst);
  const auto give_up = std::chrono::steady_clock::now() + deadline;
  while (g_holders.load(std::memory_order_seq_cst) > t_depth) {
    if (std::chrono::steady_clock::now() >= give_up) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

bool ExitGateClosed() noexcept { return g_closed.load(std::memory_order_seq_cst); }

void ResetExitGateAfterFork() noexcept { g_holders.store(t_depth, std::memory_order_seq_cst); }

}  // namespace ncclguard
