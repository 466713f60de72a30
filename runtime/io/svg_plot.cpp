#include "packtrain/runtime/io/svg_plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <stdexcept>
#include <tuple>
#include <utility>

namespace packtrain::runtime {

namespace {

// Colour-blind-friendly palette (Okabe & Ito), cycled when there are more series.
constexpr const char* kColours[] = {"#0072B2", "#D55E00", "#009E73", "#CC79A7",
                                    "#E69F00", "#56B4E9", "#F0E442", "#000000"};
constexpr double kLeft = 72, kRight = 24, kTop = 44, kBottom = 56;  // margins around the plot area

std::string number(double v, const char* format = "%.2f") {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, format, v);
  return buffer;
}

std::string escape(const std::string& text) {
  std::string out;
  for (const char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default: out += c;
    }
  }
  return out;
}

[[noreturn]] void invalid(const PlotSeries& s, const std::string& what) {
  throw std::invalid_argument("line_plot_svg: series '" + s.name + "': " + what);
}

void check_values(const PlotSeries& s, const std::vector<double>& values, const char* axis, bool log) {
  for (size_t i = 0; i < values.size(); ++i) {
    if (!std::isfinite(values[i])) invalid(s, std::string(axis) + "[" + std::to_string(i) + "] is not finite");
    if (log && values[i] <= 0) {
      invalid(s, std::string(axis) + "[" + std::to_string(i) + "] = " + number(values[i], "%g") +
                     " cannot be drawn on a log axis (values must be > 0)");
    }
  }
}

void validate(const std::vector<PlotSeries>& series, const PlotOptions& options) {
  if (series.empty()) throw std::invalid_argument("line_plot_svg: no series to draw");
  if (options.width < 240 || options.height < 180) {
    throw std::invalid_argument("line_plot_svg: size " + std::to_string(options.width) + " x " +
                                std::to_string(options.height) + " is too small (at least 240 x 180)");
  }
  for (const PlotSeries& s : series) {
    if (s.x.empty()) invalid(s, "no points");
    if (s.x.size() != s.y.size()) {
      invalid(s, std::to_string(s.x.size()) + " x values but " + std::to_string(s.y.size()) + " y values");
    }
    if (!s.y_error.empty() && s.y_error.size() != s.y.size()) {
      invalid(s, std::to_string(s.y_error.size()) + " errors for " + std::to_string(s.y.size()) + " points");
    }
    check_values(s, s.x, "x", options.log_x);
    check_values(s, s.y, "y", options.log_y);
    check_values(s, s.y_error, "y_error", false);
    for (size_t i = 0; i < s.y_error.size(); ++i) {
      if (s.y_error[i] < 0) invalid(s, "y_error[" + std::to_string(i) + "] is negative");
    }
  }
}

struct Axis {
  bool log = false;
  double lo = 0, hi = 1;      // the drawn range
  std::vector<double> ticks;  // labelled, with a grid line
  std::vector<double> minor;  // grid line only (log axes: 2..9 x each decade)
  double step = 1;            // linear tick step, for the label's decimals

  double fraction(double v) const {
    return log ? (std::log10(v) - std::log10(lo)) / (std::log10(hi) - std::log10(lo)) : (v - lo) / (hi - lo);
  }
};

// The round step (1, 2 or 5 x 10^k) nearest above range / 5.
double nice_step(double range) {
  const double raw = range / 5;
  const double decade = std::pow(10.0, std::floor(std::log10(raw)));
  for (const double m : {1.0, 2.0, 5.0}) {
    if (m * decade >= raw * (1 - 1e-9)) return m * decade;
  }
  return 10 * decade;
}

Axis linear_axis(double lo, double hi) {
  if (hi - lo <= std::abs(hi) * 1e-12) {  // one value: a range around it
    const double pad = hi == 0 ? 1 : std::abs(hi) * 0.5;
    lo -= pad;
    hi += pad;
  }
  Axis a;
  a.step = nice_step(hi - lo);
  const double first = std::floor(lo / a.step + 1e-9), last = std::ceil(hi / a.step - 1e-9);
  a.lo = first * a.step;
  a.hi = last * a.step;
  for (double i = first; i <= last + 0.5; ++i) a.ticks.push_back(i * a.step);  // multiples: no drift
  return a;
}

Axis log_axis(double lo, double hi) {
  Axis a;
  a.log = true;
  const double first = std::floor(std::log10(lo) + 1e-12);
  double last = std::ceil(std::log10(hi) - 1e-12);
  if (last <= first) last = first + 1;
  a.lo = std::pow(10.0, first);
  a.hi = std::pow(10.0, last);
  const double every = std::ceil((last - first) / 8);  // at most ~8 labelled decades
  for (double d = first; d <= last + 0.5; ++d) {
    if (std::fmod(d - first, every) == 0) a.ticks.push_back(std::pow(10.0, d));
    if (last - first > 6 || d == last) continue;
    for (int m = 2; m <= 9; ++m) a.minor.push_back(m * std::pow(10.0, d));
  }
  return a;
}

std::string tick_label(const Axis& axis, double v) {
  if (axis.log) {  // all plain (0.001 ... 100000) or all powers (1e6), never mixed on one axis
    const int e = static_cast<int>(std::lround(std::log10(v)));
    const bool plain = axis.lo >= 1e-3 * (1 - 1e-9) && axis.hi <= 1e5 * (1 + 1e-9);
    return plain ? number(v, e < 0 ? "%g" : "%.0f") : "1e" + std::to_string(e);
  }
  if (std::abs(v) < axis.step * 1e-9) return "0";
  if (std::max(std::abs(axis.lo), std::abs(axis.hi)) >= 1e6) return number(v, "%g");
  const int decimals = std::max(0, static_cast<int>(-std::floor(std::log10(axis.step) + 1e-9)));
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%.*f", decimals, v);
  return buffer;
}

struct Extent {
  double lo = std::numeric_limits<double>::infinity(), hi = -std::numeric_limits<double>::infinity();
  void add(double v) {
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
};

Axis x_axis(const std::vector<PlotSeries>& series, bool log) {
  Extent e;
  for (const PlotSeries& s : series) {
    for (const double v : s.x) e.add(v);
  }
  return log ? log_axis(e.lo, e.hi) : linear_axis(e.lo, e.hi);
}

// Includes the error bars; on a log axis, a bar reaching zero or below is cut at
// the axis instead of stretching it.
Axis y_axis(const std::vector<PlotSeries>& series, bool log) {
  Extent e;
  for (const PlotSeries& s : series) {
    for (size_t i = 0; i < s.y.size(); ++i) {
      const double err = s.y_error.empty() ? 0 : s.y_error[i];
      e.add(s.y[i] + err);
      e.add(log && s.y[i] - err <= 0 ? s.y[i] : s.y[i] - err);
    }
  }
  return log ? log_axis(e.lo, e.hi) : linear_axis(e.lo, e.hi);
}

// Pixel geometry of the plot area.
struct Frame {
  Axis x, y;
  double left, top, width, height;
  double px(double v) const { return left + x.fraction(v) * width; }
  double py(double v) const { return top + (1 - y.fraction(v)) * height; }
};

std::string line(double x1, double y1, double x2, double y2, const std::string& style) {
  return "<line x1=\"" + number(x1) + "\" y1=\"" + number(y1) + "\" x2=\"" + number(x2) + "\" y2=\"" + number(y2) +
         "\" " + style + "/>\n";
}

std::string text(double x, double y, const std::string& content, const std::string& attributes) {
  return "<text x=\"" + number(x) + "\" y=\"" + number(y) + "\" " + attributes + ">" + escape(content) + "</text>\n";
}

std::string grid_and_ticks(const Frame& f) {
  std::string out = "<g class=\"grid\">\n";
  const std::string minor = "stroke=\"#eeeeee\" stroke-width=\"1\"", major = "stroke=\"#d0d0d0\" stroke-width=\"1\"";
  for (const double v : f.x.minor) out += line(f.px(v), f.top, f.px(v), f.top + f.height, minor);
  for (const double v : f.y.minor) out += line(f.left, f.py(v), f.left + f.width, f.py(v), minor);
  for (const double v : f.x.ticks) out += line(f.px(v), f.top, f.px(v), f.top + f.height, major);
  for (const double v : f.y.ticks) out += line(f.left, f.py(v), f.left + f.width, f.py(v), major);
  out += "</g>\n<g class=\"ticks\" font-family=\"sans-serif\" font-size=\"12\" fill=\"#333333\">\n";
  for (const double v : f.x.ticks) {
    out += text(f.px(v), f.top + f.height + 18, tick_label(f.x, v), "class=\"tick-label x\" text-anchor=\"middle\"");
  }
  for (const double v : f.y.ticks) {
    out += text(f.left - 8, f.py(v) + 4, tick_label(f.y, v), "class=\"tick-label y\" text-anchor=\"end\"");
  }
  return out + "</g>\n";
}

std::string labels(const Frame& f, const PlotOptions& o) {
  std::string out = "<g font-family=\"sans-serif\" fill=\"#111111\">\n";
  out += text(f.left + f.width / 2, 26, o.title, "class=\"title\" font-size=\"16\" text-anchor=\"middle\"");
  out += text(f.left + f.width / 2, f.top + f.height + 44, o.x_label,
              "class=\"axis-label x\" font-size=\"13\" text-anchor=\"middle\"");
  const double cx = 18, cy = f.top + f.height / 2;
  out += text(cx, cy, o.y_label,
              "class=\"axis-label y\" font-size=\"13\" text-anchor=\"middle\" transform=\"rotate(-90 " + number(cx) +
                  " " + number(cy) + ")\"");
  return out + "</g>\n";
}

std::string error_bars(const Frame& f, const PlotSeries& s, const char* colour) {
  if (s.y_error.empty()) return {};
  std::string out = "<g class=\"error-bars\" stroke=\"" + std::string(colour) + "\" stroke-width=\"1.2\">\n";
  for (size_t i = 0; i < s.y.size(); ++i) {
    if (s.y_error[i] == 0) continue;
    const double x = f.px(s.x[i]), top = f.py(s.y[i] + s.y_error[i]);
    const double low = s.y[i] - s.y_error[i];
    const double bottom = f.y.log && low <= f.y.lo ? f.top + f.height : f.py(low);
    out += line(x, top, x, bottom, "") + line(x - 4, top, x + 4, top, "") + line(x - 4, bottom, x + 4, bottom, "");
  }
  return out + "</g>\n";
}

std::string series_svg(const Frame& f, const PlotSeries& s, const char* colour) {
  std::string points;
  for (size_t i = 0; i < s.x.size(); ++i) {
    if (i > 0) points += ' ';
    points += number(f.px(s.x[i])) + "," + number(f.py(s.y[i]));
  }
  std::string out = "<g class=\"series\" data-name=\"" + escape(s.name) + "\">\n" + error_bars(f, s, colour);
  out +=
      "<polyline fill=\"none\" stroke=\"" + std::string(colour) + "\" stroke-width=\"2\" points=\"" + points + "\"/>\n";
  for (size_t i = 0; i < s.x.size(); ++i) {
    out += "<circle cx=\"" + number(f.px(s.x[i])) + "\" cy=\"" + number(f.py(s.y[i])) + "\" r=\"3.5\" fill=\"" +
           colour + "\"/>\n";
  }
  return out + "</g>\n";
}

// Points of the drawn lines (markers and segment samples) inside a box.
int64_t covered(const Frame& f, const std::vector<PlotSeries>& series, double x, double y, double w, double h) {
  int64_t n = 0;
  for (const PlotSeries& s : series) {
    for (size_t i = 0; i < s.x.size(); ++i) {
      const double x1 = f.px(s.x[i]), y1 = f.py(s.y[i]);
      const double x0 = i > 0 ? f.px(s.x[i - 1]) : x1, y0 = i > 0 ? f.py(s.y[i - 1]) : y1;
      for (int t = 0; t <= 8; ++t) {
        const double px = x0 + (x1 - x0) * t / 8, py = y0 + (y1 - y0) * t / 8;
        n += px >= x && px <= x + w && py >= y && py <= y + h ? 1 : 0;
      }
    }
  }
  return n;
}

std::string legend(const Frame& f, const std::vector<PlotSeries>& series) {
  size_t longest = 0;
  for (const PlotSeries& s : series) longest = std::max(longest, s.name.size());
  const double width = 40 + 7.0 * static_cast<double>(longest), row = 18;
  const double height = 8 + row * static_cast<double>(series.size());
  // The corner hiding the least of the data: top right, top left, bottom right, bottom left.
  const double right = f.left + f.width - width - 8, left = f.left + 8;
  const double top = f.top + 8, bottom = f.top + f.height - height - 8;
  double x = right, y = top;
  int64_t best = -1;
  for (const auto& [cx, cy] : {std::pair{right, top}, {left, top}, {right, bottom}, {left, bottom}}) {
    const int64_t n = covered(f, series, cx, cy, width, height);
    if (best < 0 || n < best) std::tie(best, x, y) = std::tuple{n, cx, cy};
  }
  std::string out = "<g class=\"legend\" font-family=\"sans-serif\" font-size=\"12\">\n";
  out += "<rect x=\"" + number(x) + "\" y=\"" + number(y) + "\" width=\"" + number(width) + "\" height=\"" +
         number(height) + "\" fill=\"#ffffff\" fill-opacity=\"0.85\" stroke=\"#bbbbbb\"/>\n";
  for (size_t i = 0; i < series.size(); ++i) {
    const char* colour = kColours[i % std::size(kColours)];
    const double cy = y + 4 + row * (static_cast<double>(i) + 0.5);
    out += line(x + 8, cy, x + 30, cy, "stroke=\"" + std::string(colour) + "\" stroke-width=\"2\"");
    out += text(x + 36, cy + 4, series[i].name, "class=\"legend-label\" fill=\"#111111\"");
  }
  return out + "</g>\n";
}

}  // namespace

std::string line_plot_svg(const std::vector<PlotSeries>& series, const PlotOptions& options) {
  validate(series, options);
  const double w = options.width, h = options.height;
  const Frame f{x_axis(series, options.log_x),
                y_axis(series, options.log_y),
                kLeft,
                kTop,
                w - kLeft - kRight,
                h - kTop - kBottom};
  std::string svg = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + std::to_string(options.width) +
                    "\" height=\"" + std::to_string(options.height) + "\" viewBox=\"0 0 " +
                    std::to_string(options.width) + " " + std::to_string(options.height) + "\">\n";
  svg += "<rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n";
  svg += grid_and_ticks(f);
  svg += "<rect class=\"frame\" x=\"" + number(f.left) + "\" y=\"" + number(f.top) + "\" width=\"" + number(f.width) +
         "\" height=\"" + number(f.height) + "\" fill=\"none\" stroke=\"#333333\"/>\n";
  for (size_t i = 0; i < series.size(); ++i) svg += series_svg(f, series[i], kColours[i % std::size(kColours)]);
  svg += legend(f, series);
  svg += labels(f, options);
  return svg + "</svg>\n";
}

}  // namespace packtrain::runtime
