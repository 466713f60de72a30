#include "packtrain/runtime/cli/interrupt.h"

#include <unistd.h>
#include <csignal>
#include <cstring>

namespace packtrain::cli {

namespace {

volatile std::sig_atomic_t g_presses = 0;
volatile std::sig_atomic_t g_end_after = 0;
const char* volatile g_announce = nullptr;

extern "C" void on_interrupt(int) {
  g_presses = g_presses + 1;
  if (g_presses == 1 && g_announce != nullptr) {
    const ssize_t ignored = write(STDERR_FILENO, g_announce, std::strlen(g_announce));
    (void)ignored;
  }
  // The next press takes the default action: the process ends at once.
  if (g_end_after > 0 && g_presses + 1 >= g_end_after) std::signal(SIGINT, SIG_DFL);
}

}  // namespace

Interrupts::Interrupts(int end_after, const char* announce) {
  g_presses = 0;
  g_end_after = end_after;
  g_announce = announce;
  struct sigaction action {};
  action.sa_handler = on_interrupt;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, &previous_);
}

Interrupts::~Interrupts() { sigaction(SIGINT, &previous_, nullptr); }

int64_t Interrupts::presses() const { return g_presses; }

}  // namespace packtrain::cli
