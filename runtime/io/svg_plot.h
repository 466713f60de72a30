// Line charts as standalone SVG documents, without dependencies: learning curves
// and throughput plots that open in any browser. Round ticks (1, 2, 5 x 10^k) on
// linear axes, decades on log axes; a grid, one coloured polyline with markers per
// series, optional error bars, and a legend.
#pragma once

#include <string>
#include <vector>

namespace packtrain::runtime {

struct PlotSeries {
  std::string name;
  std::vector<double> x, y;
  std::vector<double> y_error;  // empty, or one >= 0 half-width per point: drawn as y ± error bars
};

struct PlotOptions {
  std::string title, x_label, y_label;
  bool log_x = false, log_y = false;
  int width = 720, height = 450;  // pixels, at least 240 x 180
};

// A complete SVG document. Throws std::invalid_argument, naming the series and the
// value, on no series, an empty series, x/y/y_error of different lengths, a
// non-finite value, a negative error, a non-positive value on a log axis, or a size
// too small to draw in.
std::string line_plot_svg(const std::vector<PlotSeries>& series, const PlotOptions& options);

}  // namespace packtrain::runtime
