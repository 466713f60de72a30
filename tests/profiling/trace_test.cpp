// The Chrome trace export: ranges and counters recorded while tracing, valid JSON
// that Perfetto and chrome://tracing read (traceEvents with ph/ts/dur/pid/tid).
#include "packtrain/profiling/trace.h"
#include "packtrain/profiling/nvtx.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <unistd.h>
#include <string>
#include <thread>

namespace {

using namespace packtrain::profiling;

nlohmann::json events_named(const nlohmann::json& trace, const std::string& name) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& e : trace.at("traceEvents")) {
    if (e.value("name", "") == name) out.push_back(e);
  }
  return out;
}

TEST(Trace, RecordsNestedRangesWithContainedTimes) {
  trace_start();
  {
    NvtxRange outer("epoch");
    for (int i = 0; i < 3; ++i) {
      NvtxRange inner("step");
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }
  trace_counter("device us per step", 42.5);
  trace_stop();
  const nlohmann::json trace = nlohmann::json::parse(chrome_trace_json());
  const nlohmann::json epoch = events_named(trace, "epoch");
  const nlohmann::json steps = events_named(trace, "step");
  ASSERT_EQ(epoch.size(), 1u);
  ASSERT_EQ(steps.size(), 3u);
  const double begin = epoch[0].at("ts"), end = begin + epoch[0].at("dur").get<double>();
  for (const auto& s : steps) {
    EXPECT_EQ(s.at("ph"), "X");
    EXPECT_GE(s.at("dur").get<double>(), 150.0) << "each step slept 200 us";
    EXPECT_GE(s.at("ts").get<double>(), begin);
    EXPECT_LE(s.at("ts").get<double>() + s.at("dur").get<double>(), end + 1e-3);
    EXPECT_EQ(s.at("tid"), epoch[0].at("tid"));
    EXPECT_EQ(s.at("pid"), static_cast<int>(::getpid()));
  }
  const nlohmann::json counter = events_named(trace, "device us per step");
  ASSERT_EQ(counter.size(), 1u);
  EXPECT_EQ(counter[0].at("ph"), "C");
  EXPECT_DOUBLE_EQ(counter[0].at("args").at("value").get<double>(), 42.5);
}

TEST(Trace, RecordsNothingWhenNotStartedAndIgnoresRangesOpenedBefore) {
  trace_start();
  trace_stop();
  { NvtxRange r("untraced"); }
  EXPECT_EQ(trace_event_count(), 0);
  {
    NvtxRange before("opened-before-start");
    trace_start();
    { NvtxRange inside("inside"); }
  }  // closes after start: its push was not recorded, so it is dropped
  trace_stop();
  const nlohmann::json trace = nlohmann::json::parse(chrome_trace_json());
  EXPECT_EQ(events_named(trace, "inside").size(), 1u);
  EXPECT_EQ(events_named(trace, "opened-before-start").size(), 0u);
}

TEST(Trace, RangesFromSeveralThreadsGetTheirOwnThreadIds) {
  trace_start();
  std::thread a([] { NvtxRange r("worker"); });
  a.join();
  { NvtxRange r("main"); }
  trace_stop();
  const nlohmann::json trace = nlohmann::json::parse(chrome_trace_json());
  ASSERT_EQ(events_named(trace, "worker").size(), 1u);
  ASSERT_EQ(events_named(trace, "main").size(), 1u);
  EXPECT_NE(events_named(trace, "worker")[0].at("tid"), events_named(trace, "main")[0].at("tid"));
}

}  // namespace
