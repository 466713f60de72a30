// A test-only NVTX injection library: loaded by the NVTX runtime when
// NVTX_INJECTION64_PATH names it (as Nsight Systems' own library is), it records
// every range pushed and popped in the `packtrain` domain, so a test can check
// that the ranges are really emitted through NVTX, not merely called.
#include <nvtx3/nvToolsExt.h>

#include <cstring>
#include <mutex>
#include <string>

namespace {

struct Domain {
  std::string name;
};

std::mutex g_mutex;
std::string g_events;  // one line per event: "+name" (push) or "-" (pop)

nvtxDomainHandle_t NVTX_API create_domain(const char* name) {
  return reinterpret_cast<nvtxDomainHandle_t>(new Domain{name});  // lives for the process
}

bool is_packtrain(nvtxDomainHandle_t domain) {
  return domain != nullptr && reinterpret_cast<const Domain*>(domain)->name == "packtrain";
}

int NVTX_API push(nvtxDomainHandle_t domain, const nvtxEventAttributes_t* attributes) {
  if (!is_packtrain(domain)) return 0;
  const char* name =
      attributes != nullptr && attributes->messageType == NVTX_MESSAGE_TYPE_ASCII ? attributes->message.ascii : "?";
  std::lock_guard lock(g_mutex);
  g_events += std::string("+") + name + "\n";
  return 0;
}

int NVTX_API pop(nvtxDomainHandle_t domain) {
  if (!is_packtrain(domain)) return 0;
  std::lock_guard lock(g_mutex);
  g_events += "-\n";
  return 0;
}

}  // namespace

extern "C" {

// Called by each module's NVTX runtime on its first NVTX call.
__attribute__((visibility("default"))) int InitializeInjectionNvtx2(NvtxGetExportTableFunc_t get_export_table) {
  const auto* callbacks = static_cast<const NvtxExportTableCallbacks*>(get_export_table(NVTX_ETID_CALLBACKS));
  if (callbacks == nullptr) return 0;
  NvtxFunctionTable table = nullptr;
  unsigned int size = 0;
  if (!callbacks->GetModuleFunctionTable(NVTX_CB_MODULE_CORE2, &table, &size) || table == nullptr) return 0;
  if (size <= NVTX_CBID_CORE2_DomainCreateA) return 0;
  *table[NVTX_CBID_CORE2_DomainCreateA] = reinterpret_cast<NvtxFunctionPointer>(&create_domain);
  *table[NVTX_CBID_CORE2_DomainRangePushEx] = reinterpret_cast<NvtxFunctionPointer>(&push);
  *table[NVTX_CBID_CORE2_DomainRangePop] = reinterpret_cast<NvtxFunctionPointer>(&pop);
  return 1;
}

// For the test: the events so far (copied into `out`, at most `capacity` bytes
// with the terminating zero); returns the full length.
__attribute__((visibility("default"))) size_t packtrain_nvtx_recorder_events(char* out, size_t capacity) {
  std::lock_guard lock(g_mutex);
  if (capacity > 0) {
    const size_t n = std::min(capacity - 1, g_events.size());
    std::memcpy(out, g_events.data(), n);
    out[n] = '\0';
  }
  return g_events.size();
}

__attribute__((visibility("default"))) void packtrain_nvtx_recorder_clear() {
  std::lock_guard lock(g_mutex);
  g_events.clear();
}
}
