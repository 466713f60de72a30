// NVTX push/pop in the `packtrain` domain (nvtx3 is header-only; kept out of our
// public headers so only this file sees it).
#include "packtrain/profiling/nvtx.h"

#include "packtrain/profiling/trace.h"

#if PACKTRAIN_HAVE_NVTX
#include <nvtx3/nvToolsExt.h>
#endif

namespace packtrain::profiling {

#if PACKTRAIN_HAVE_NVTX
namespace {
nvtxDomainHandle_t packtrain_domain() noexcept {
  static const nvtxDomainHandle_t domain = nvtxDomainCreateA("packtrain");
  return domain;
}
}  // namespace

bool nvtx_compiled_in() noexcept { return true; }

void nvtx_push(const char* name) noexcept {
  nvtxEventAttributes_t attributes{};
  attributes.version = NVTX_VERSION;
  attributes.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
  attributes.messageType = NVTX_MESSAGE_TYPE_ASCII;
  attributes.message.ascii = name;
  nvtxDomainRangePushEx(packtrain_domain(), &attributes);
  detail::trace_push(name);
}

void nvtx_pop() noexcept {
  detail::trace_pop();
  nvtxDomainRangePop(packtrain_domain());
}
#else
bool nvtx_compiled_in() noexcept { return false; }
void nvtx_push(const char* name) noexcept { detail::trace_push(name); }
void nvtx_pop() noexcept { detail::trace_pop(); }
#endif

}  // namespace packtrain::profiling
