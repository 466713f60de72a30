// The one SIGINT handler of the packtrain commands. While an Interrupts object
// lives, Ctrl-C presses are counted (the run driver stops after the current epoch
// at the first; `launch` forwards each to its ranks); with `end_after` > 0, that
// many presses end the process at once with the default action. The destructor
// restores the handler it replaced.
#pragma once

#include <signal.h>

#include <cstdint>

namespace packtrain::cli {

class Interrupts {
 public:
  // `announce`: on the first press, say on stderr what happens (once per object).
  Interrupts(int end_after, const char* announce = nullptr);
  ~Interrupts();
  Interrupts(const Interrupts&) = delete;
  Interrupts& operator=(const Interrupts&) = delete;

  int64_t presses() const;  // Ctrl-C presses since construction

 private:
  struct sigaction previous_ {};
};

}  // namespace packtrain::cli
