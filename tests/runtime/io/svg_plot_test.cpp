// The SVG line-chart writer: a well-formed document with one polyline per series,
// legend entries, decade ticks on log axes, round ticks on linear ones, escaped
// text, and std::invalid_argument for data it cannot draw.
#include "packtrain/runtime/io/svg_plot.h"

#include <gtest/gtest.h>

#include <cmath>
#include <regex>
#include <stdexcept>
#include <string>
#include <vector>

namespace packtrain::runtime {
namespace {

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + what.size())) ++n;
  return n;
}

// The texts of <text class="tick-label AXIS" ...>VALUE</text>.
std::vector<std::string> tick_labels(const std::string& svg, char axis) {
  const std::regex pattern(std::string("class=\"tick-label ") + axis + "\"[^>]*>([^<]*)</text>");
  std::vector<std::string> out;
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), pattern); it != std::sregex_iterator(); ++it) {
    out.push_back((*it)[1]);
  }
  return out;
}

std::vector<PlotSeries> two_series() {
  return {{"packed", {1, 8, 64, 512}, {3e2, 2.4e3, 1.9e4, 1.2e5}, {}},
          {"loop", {1, 8, 64, 512}, {2e2, 2.1e2, 2.2e2, 2.2e2}, {10, 10, 12, 9}}};
}

TEST(SvgPlot, WellFormed_OnePolylinePerSeries_LegendNames) {
  PlotOptions o;
  o.title = "Throughput";
  o.x_label = "members";
  o.y_label = "member-steps/s";
  const std::string svg = line_plot_svg(two_series(), o);
  EXPECT_EQ(svg.rfind("<svg", 0), 0u) << svg.substr(0, 80);
  EXPECT_EQ(svg.substr(svg.size() - 7), "</svg>\n");
  EXPECT_EQ(count(svg, "<svg"), 1u);
  EXPECT_EQ(count(svg, "<polyline"), 2u);
  EXPECT_EQ(count(svg, "<circle"), 8u);  // a marker per point
  EXPECT_EQ(count(svg, "class=\"legend-label\" fill=\"#111111\">packed</text>"), 1u);
  EXPECT_EQ(count(svg, "class=\"legend-label\" fill=\"#111111\">loop</text>"), 1u);
  EXPECT_NE(svg.find(">Throughput</text>"), std::string::npos);
  EXPECT_NE(svg.find(">member-steps/s</text>"), std::string::npos);
  EXPECT_EQ(count(svg, "<g"), count(svg, "</g>"));
  EXPECT_EQ(count(svg, "<text"), count(svg, "</text>"));
  EXPECT_EQ(count(svg, "class=\"error-bars\""), 1u);  // only the series with errors
}

TEST(SvgPlot, LogAxes_TicksAreDecades) {
  PlotOptions o;
  o.log_x = o.log_y = true;
  const std::string svg = line_plot_svg(two_series(), o);
  EXPECT_EQ(tick_labels(svg, 'x'), (std::vector<std::string>{"1", "10", "100", "1000"}));
  EXPECT_EQ(tick_labels(svg, 'y'), (std::vector<std::string>{"1e2", "1e3", "1e4", "1e5", "1e6"}));
}

TEST(SvgPlot, LogAxes_SmallAndHugeDecades) {
  PlotOptions o;
  o.log_y = true;
  const std::string svg = line_plot_svg({{"s", {0, 1}, {2e-3, 0.5}, {}}}, o);
  EXPECT_EQ(tick_labels(svg, 'y'), (std::vector<std::string>{"0.001", "0.01", "0.1", "1"}));
  const std::string huge = line_plot_svg({{"s", {0, 1}, {3e6, 4e7}, {}}}, o);
  EXPECT_EQ(tick_labels(huge, 'y'), (std::vector<std::string>{"1e6", "1e7", "1e8"}));
}

TEST(SvgPlot, LinearAxes_RoundTicksCoverTheData) {
  const std::string svg = line_plot_svg({{"s", {20, 30, 90}, {0.93, 1.7, 2.45}, {0.1, 0.1, 0.1}}}, {});
  EXPECT_EQ(tick_labels(svg, 'x'), (std::vector<std::string>{"20", "40", "60", "80", "100"}));
  EXPECT_EQ(tick_labels(svg, 'y'), (std::vector<std::string>{"0.5", "1.0", "1.5", "2.0", "2.5", "3.0"}));
}

TEST(SvgPlot, OnePointAndTextAreHandled) {
  PlotOptions o;
  o.title = "a < b & \"c\"";
  const std::string svg = line_plot_svg({{"x<y", {5}, {5}, {}}}, o);
  EXPECT_NE(svg.find(">a &lt; b &amp; &quot;c&quot;</text>"), std::string::npos);
  EXPECT_NE(svg.find(">x&lt;y</text>"), std::string::npos);
  EXPECT_EQ(svg.find("nan"), std::string::npos);
  EXPECT_EQ(svg.find("inf"), std::string::npos);
}

TEST(SvgPlot, InvalidInput_Throws) {
  PlotOptions log_y;
  log_y.log_y = true;
  PlotOptions tiny;
  tiny.width = 10;
  EXPECT_THROW(line_plot_svg({}, {}), std::invalid_argument);
  EXPECT_THROW(line_plot_svg({{"empty", {}, {}, {}}}, {}), std::invalid_argument);
  EXPECT_THROW(line_plot_svg({{"ragged", {1, 2}, {1}, {}}}, {}), std::invalid_argument);
  EXPECT_THROW(line_plot_svg({{"errors", {1, 2}, {1, 2}, {0.1}}}, {}), std::invalid_argument);
  EXPECT_THROW(line_plot_svg({{"negative error", {1, 2}, {1, 2}, {0.1, -0.1}}}, {}), std::invalid_argument);
  EXPECT_THROW(line_plot_svg({{"nan", {1, 2}, {1, std::nan("")}, {}}}, {}), std::invalid_argument);
  EXPECT_THROW(line_plot_svg({{"zero", {1, 2}, {0, 2}, {}}}, log_y), std::invalid_argument);
  EXPECT_THROW(line_plot_svg({{"fine", {1, 2}, {1, 2}, {}}}, tiny), std::invalid_argument);
  try {
    line_plot_svg({{"zero", {1, 2}, {-3, 2}, {}}}, log_y);
    ADD_FAILURE() << "a negative value on a log axis did not throw";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("'zero'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("y[0] = -3"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace packtrain::runtime
