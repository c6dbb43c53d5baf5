// The memory anatomy page (see memory_html.h).
#include "train/memory_html.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>

#include "core/error.h"
#include "core/json_file.h"

namespace brisk {

namespace {
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
}  // namespace

std::string memory_html(const std::string& title, const std::string& subtitle,
                        const std::vector<MemoryBar>& bars) {
  size_t top = 1;
  for (const MemoryBar& b : bars) {
    size_t total = b.fixed;
    for (size_t v : b.planned) total += v;
    top = std::max(top, total);
    for (const auto& [name, v] : b.measured) top = std::max(top, v);
  }
  const double top_mib = static_cast<double>(top) / (1 << 20) * 1.08;
  const double step = tick_mib(top_mib);
  const int bar_w = 70, gap = 60, left = 90, plot_h = 360, top_pad = 20, label_h = 70;
  const int width = left + static_cast<int>(bars.size()) * (bar_w + gap) + 40;
  const int height = top_pad + plot_h + label_h;
  auto y_of = [&](double mib_value) { return top_pad + plot_h * (1.0 - mib_value / top_mib); };

  std::string svg = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + std::to_string(width) +
                    "\" height=\"" + std::to_string(height) + "\" font-family=\"sans-serif\" " +
                    "font-size=\"12\">\n";
  for (double t = 0; t <= top_mib; t += step) {
    const std::string y = num(y_of(t));
    svg += "<line x1=\"" + std::to_string(left - 5) + "\" x2=\"" + std::to_string(width - 20) +
           "\" y1=\"" + y + "\" y2=\"" + y + "\" stroke=\"#ddd\"/>\n";
    svg += "<text x=\"" + std::to_string(left - 8) + "\" y=\"" + y +
           "\" text-anchor=\"end\" dominant-baseline=\"middle\">" + num(t) + " MiB</text>\n";
  }
  for (size_t i = 0; i < bars.size(); ++i) {
    const MemoryBar& b = bars[i];
    const int x = left + static_cast<int>(i) * (bar_w + gap);
    double base = 0;
    auto segment = [&](size_t bytes, const char* color, const std::string& what) {
      if (bytes == 0) return;
      const double h = static_cast<double>(bytes) / (1 << 20);
      svg += "<rect x=\"" + std::to_string(x) + "\" y=\"" + num(y_of(base + h)) + "\" width=\"" +
             std::to_string(bar_w) + "\" height=\"" + num(y_of(base) - y_of(base + h)) +
             "\" fill=\"" + color + "\"><title>" + escape(what) + ": " + format_mib(bytes) +
             "</title></rect>\n";
      base += h;
    };
    for (int c = 0; c < kNumCategories; ++c)
      segment(b.planned[c], kColors[c], category_name(static_cast<Category>(c)));
    segment(b.fixed, kFixedColor, b.fixed_label);
    svg += "<text x=\"" + std::to_string(x + bar_w / 2) + "\" y=\"" + num(y_of(base) - 4) +
           "\" text-anchor=\"middle\">" + format_mib(static_cast<size_t>(base * (1 << 20))) +
           "</text>\n";
    int row = 0;
    for (const auto& [name, bytes] : b.measured) {
      const std::string y = num(y_of(static_cast<double>(bytes) / (1 << 20)));
      svg += "<line x1=\"" + std::to_string(x - 6) + "\" x2=\"" + std::to_string(x + bar_w + 6) +
             "\" y1=\"" + y + "\" y2=\"" + y + "\" stroke=\"" + kMeasuredColor +
             "\" stroke-width=\"2\" stroke-dasharray=\"" + (row ? "4 3" : "none") + "\"><title>" +
             escape(name) + ": " + format_mib(bytes) + "</title></line>\n";
      // Labels of lines that lie close together go one under the other.
      svg += "<text x=\"" + std::to_string(x + bar_w + 8) + "\" y=\"" +
             num(y_of(static_cast<double>(bytes) / (1 << 20)) + 11.0 * row) +
             "\" dominant-baseline=\"middle\" font-size=\"10\">" + escape(name) + "</text>\n";
      ++row;
    }
    // The label, one line per '\n'.
    size_t line = 0, start = 0;
    for (size_t end = 0; end <= b.label.size(); ++end) {
      if (end < b.label.size() && b.label[end] != '\n') continue;
      svg += "<text x=\"" + std::to_string(x + bar_w / 2) + "\" y=\"" +
             std::to_string(top_pad + plot_h + 18 + 15 * static_cast<int>(line++)) +
             "\" text-anchor=\"middle\">" + escape(b.label.substr(start, end - start)) +
             "</text>\n";
      start = end + 1;
    }
  }
  svg += "</svg>\n";

  std::string legend;
  for (int c = 0; c < kNumCategories; ++c)
    legend += std::string("<span><i style=\"background:") + kColors[c] + "\"></i>" +
              category_name(static_cast<Category>(c)) + "</span>";
  legend += std::string("<span><i style=\"background:") + kFixedColor +
            "\"></i>outside the plan</span><span><i style=\"background:" + kMeasuredColor +
            ";height:2px\"></i>measured</span>";
  std::string table = "<table><tr><th></th>";
  for (const MemoryBar& b : bars) {
    std::string label = b.label;
    std::replace(label.begin(), label.end(), '\n', ' ');
    table += "<th>" + escape(label) + "</th>";
  }
  table += "</tr>";
  for (int c = 0; c < kNumCategories; ++c) {
    table += std::string("<tr><td>") + category_name(static_cast<Category>(c)) + "</td>";
    for (const MemoryBar& b : bars) table += "<td>" + format_mib(b.planned[c]) + "</td>";
    table += "</tr>";
  }
  table += "<tr><td>outside the plan</td>";
  for (const MemoryBar& b : bars) table += "<td>" + format_mib(b.fixed) + "</td>";
  table += "</tr></table>";

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
