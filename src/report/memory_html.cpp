// The memory anatomy page (see memory_html.h).
#include "report/memory_html.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>

#include "core/error.h"
#include "core/json_file.h"

namespace brisk {

namespace {
constexpr int kGradients = static_cast<int>(Category::gradients);

// One color per category, in the order of Category; the fixed part is grey.
constexpr const char* kColors[kNumCategories] = {"#4e79a7", "#a0cbe8", "#f28e2b", "#e15759",
                                                 "#59a14f", "#edc948", "#b07aa1"};
constexpr const char* kFixedColor = "#bab0ac";
constexpr const char* kMeasuredColor = "#222222";

std::string escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '&':
        out += "&amp;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}

// A tick step of 1, 2 or 5 x 10^k MiB giving about five ticks up to `top` bytes.
double tick_mib(double top_mib) {
  const double raw = std::max(top_mib / 5.0, 1e-3);
  const double p = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0})
    if (m * p >= raw) return m * p;
  return 10 * p;
}

// The chart's geometry: the scale (top_mib, the tick step) and the fixed sizes in pixels.
struct Chart {
  static constexpr int bar_w = 70, gap = 60, left = 90, plot_h = 360, top_pad = 20, label_h = 70;
  double top_mib, step;
  int width, height;
  double y_of(double mib_value) const { return top_pad + plot_h * (1.0 - mib_value / top_mib); }
};

// The geometry for `bars`: the scale 8% above the tallest bar or measured line.
Chart chart_for(const std::vector<MemoryBar>& bars) {
  size_t top = 1;
  for (const MemoryBar& b : bars) {
    size_t total = b.fixed;
    for (size_t v : b.planned) total += v;
    total -= b.overlaid;  // drawn once
    top = std::max(top, total);
    for (const auto& [name, v] : b.measured) top = std::max(top, v);
  }
  const double top_mib = static_cast<double>(top) / (1 << 20) * 1.08;
  const int width = Chart::left + static_cast<int>(bars.size()) * (Chart::bar_w + Chart::gap) + 40;
  return Chart{top_mib, tick_mib(top_mib), width, Chart::top_pad + Chart::plot_h + Chart::label_h};
}

// The svg element's opening tag and the horizontal grid lines with their MiB labels.
std::string svg_axis(const Chart& ch) {
  std::string svg = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" +
                    std::to_string(ch.width) + "\" height=\"" + std::to_string(ch.height) +
                    "\" font-family=\"sans-serif\" " + "font-size=\"12\">\n";
  for (double t = 0; t <= ch.top_mib; t += ch.step) {
    const std::string y = num(ch.y_of(t));
    svg += "<line x1=\"" + std::to_string(Chart::left - 5) + "\" x2=\"" +
           std::to_string(ch.width - 20) + "\" y1=\"" + y + "\" y2=\"" + y +
           "\" stroke=\"#ddd\"/>\n";
    svg += "<text x=\"" + std::to_string(Chart::left - 8) + "\" y=\"" + y +
           "\" text-anchor=\"end\" dominant-baseline=\"middle\">" + num(t) + " MiB</text>\n";
  }
  return svg;
}

// A bar's segment of `bytes` (none when 0) at x, stacked on *base (MiB), which it raises.
void svg_segment(std::string& svg, const Chart& ch, int x, double* base, size_t bytes,
                 const char* color, const std::string& what) {
  if (bytes == 0) return;
  const double h = static_cast<double>(bytes) / (1 << 20);
  svg += "<rect x=\"" + std::to_string(x) + "\" y=\"" + num(ch.y_of(*base + h)) + "\" width=\"" +
         std::to_string(Chart::bar_w) + "\" height=\"" + num(ch.y_of(*base) - ch.y_of(*base + h)) +
         "\" fill=\"" + color + "\"><title>" + escape(what) + ": " + format_mib(bytes) +
         "</title></rect>\n";
  *base += h;
}

// A bar's measured lines, each with its label beside the bar.
void svg_measured(std::string& svg, const Chart& ch, const MemoryBar& b, int x) {
  int row = 0;
  for (const auto& [name, bytes] : b.measured) {
    const std::string y = num(ch.y_of(static_cast<double>(bytes) / (1 << 20)));
    svg += "<line x1=\"" + std::to_string(x - 6) + "\" x2=\"" +
           std::to_string(x + Chart::bar_w + 6) + "\" y1=\"" + y + "\" y2=\"" + y + "\" stroke=\"" +
           kMeasuredColor + "\" stroke-width=\"2\" stroke-dasharray=\"" + (row ? "4 3" : "none") +
           "\"><title>" + escape(name) + ": " + format_mib(bytes) + "</title></line>\n";
    // Labels of lines that lie close together go one under the other.
    svg += "<text x=\"" + std::to_string(x + Chart::bar_w + 8) + "\" y=\"" +
           num(ch.y_of(static_cast<double>(bytes) / (1 << 20)) + 11.0 * row) +
           "\" dominant-baseline=\"middle\" font-size=\"10\">" + escape(name) + "</text>\n";
    ++row;
  }
}

// A bar's label under it, one line per '\n'.
void svg_label(std::string& svg, const MemoryBar& b, int x) {
  size_t line = 0, start = 0;
  for (size_t end = 0; end <= b.label.size(); ++end) {
    if (end < b.label.size() && b.label[end] != '\n') continue;
    svg += "<text x=\"" + std::to_string(x + Chart::bar_w / 2) + "\" y=\"" +
           std::to_string(Chart::top_pad + Chart::plot_h + 18 + 15 * static_cast<int>(line++)) +
           "\" text-anchor=\"middle\">" + escape(b.label.substr(start, end - start)) + "</text>\n";
    start = end + 1;
  }
}

// Bar i: its stacked segments (categories, then the fixed part) with their total above, its
// measured lines and its label.
void svg_bar(std::string& svg, const Chart& ch, const MemoryBar& b, size_t i) {
  const int x = Chart::left + static_cast<int>(i) * (Chart::bar_w + Chart::gap);
  double base = 0;
  for (int c = 0; c < kNumCategories; ++c)
    svg_segment(svg, ch, x, &base, b.planned[c] - (c == kGradients ? b.overlaid : 0), kColors[c],
                category_name(static_cast<Category>(c)));
  svg_segment(svg, ch, x, &base, b.fixed, kFixedColor, b.fixed_label);
  svg += "<text x=\"" + std::to_string(x + Chart::bar_w / 2) + "\" y=\"" + num(ch.y_of(base) - 4) +
         "\" text-anchor=\"middle\">" + format_mib(static_cast<size_t>(base * (1 << 20))) +
         "</text>\n";
  svg_measured(svg, ch, b, x);
  svg_label(svg, b, x);
}

// The colors' legend: one per category, the fixed part and the measured lines.
std::string legend_html() {
  std::string legend;
  for (int c = 0; c < kNumCategories; ++c)
    legend += std::string("<span><i style=\"background:") + kColors[c] + "\"></i>" +
              category_name(static_cast<Category>(c)) + "</span>";
  legend += std::string("<span><i style=\"background:") + kFixedColor +
            "\"></i>outside the plan</span><span><i style=\"background:" + kMeasuredColor +
            ";height:2px\"></i>measured</span>";
  return legend;
}

// The bars' numbers as a table: a column per bar, a row per category and the fixed part.
std::string table_html(const std::vector<MemoryBar>& bars) {
  std::string table = "<table><tr><th></th>";
  for (const MemoryBar& b : bars) {
    std::string label = b.label;
    std::replace(label.begin(), label.end(), '\n', ' ');
    table += "<th>" + escape(label) + "</th>";
  }
  table += "</tr>";
  for (int c = 0; c < kNumCategories; ++c) {
    table += std::string("<tr><td>") + category_name(static_cast<Category>(c)) + "</td>";
    for (const MemoryBar& b : bars) {
      table += "<td>" + format_mib(b.planned[c]);
      if (c == kGradients && b.overlaid > 0)
        table += " (" + format_mib(b.overlaid) + " over consumed activations)";
      table += "</td>";
    }
    table += "</tr>";
  }
  table += "<tr><td>outside the plan</td>";
  for (const MemoryBar& b : bars) table += "<td>" + format_mib(b.fixed) + "</td>";
  table += "</tr></table>";
  return table;
}
}  // namespace

std::string memory_html(const std::string& title, const std::string& subtitle,
                        const std::vector<MemoryBar>& bars) {
  const Chart ch = chart_for(bars);
  std::string svg = svg_axis(ch);
  for (size_t i = 0; i < bars.size(); ++i) svg_bar(svg, ch, bars[i], i);
  svg += "</svg>\n";
  const std::string legend = legend_html(), table = table_html(bars);
  return "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>" + escape(title) +
         "</title>\n<style>body{font-family:sans-serif;margin:20px}"
         "span{margin-right:14px;font-size:13px}i{display:inline-block;width:12px;height:12px;"
         "margin-right:4px;vertical-align:middle}table{border-collapse:collapse;margin-top:12px;"
         "font-size:13px}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}"
         "td:first-child{text-align:left}</style></head>\n<body>\n<h2>" +
         escape(title) + "</h2>\n<p>" + escape(subtitle) + "</p>\n<div>" + legend + "</div>\n" +
         svg + table + "\n</body></html>\n";
}

void write_memory_html(const std::string& path, const std::string& title,
                       const std::string& subtitle, const std::vector<MemoryBar>& bars) {
  write_file_atomically(path, memory_html(title, subtitle, bars));
}

}  // namespace brisk
