// The memory anatomy page: a bar's total counts gradients laid over consumed activations once,
// the scale reaches the tallest bar or measured line, text is escaped.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "report/memory_html.h"

namespace brisk::testing {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

MemoryBar bar(const std::string& label, size_t overlaid, size_t fixed) {
  MemoryBar b;
  b.label = label;
  b.planned[static_cast<int>(Category::weights)] = 100 * kMiB;
  b.planned[static_cast<int>(Category::gradients)] = 60 * kMiB;
  b.planned[static_cast<int>(Category::activations)] = 80 * kMiB;
  b.overlaid = overlaid;
  b.fixed = fixed;
  return b;
}

bool has(const std::string& page, const std::string& text) {
  return page.find(text) != std::string::npos;
}

TEST(MemoryHtml, OverlaidGradientsCountOnceInTheTotalAndTheScale) {
  // 100 + 60 + 80 planned, 40 of the gradients over consumed activations, nothing outside the
  // plan (more overlaid than fixed): 200 MiB drawn; scaled to 216, ticks every 50 MiB.
  const std::string page = memory_html("t", "s", {bar("a", 40 * kMiB, 0)});
  EXPECT_TRUE(has(page, "text-anchor=\"middle\">200.0 MiB</text>")) << page;
  EXPECT_TRUE(has(page, "<title>gradients: 20.0 MiB</title>"));
  EXPECT_TRUE(has(page, "60.0 MiB (40.0 MiB over consumed activations)"));
  EXPECT_FALSE(has(page, ">250.0 MiB</text>"));
  // The bar reaches 200 of 216 MiB, y = 20 + 360 * (1 - 200 / 216) = 46.7: as high as the top
  // grid line, its total 4 px above.
  EXPECT_TRUE(has(page, "y=\"46.7\" text-anchor=\"end\" dominant-baseline=\"middle\">200.0 MiB"));
  EXPECT_TRUE(has(page, "<rect x=\"90\" y=\"46.7\""));
  EXPECT_TRUE(has(page, "y=\"42.7\" text-anchor=\"middle\">200.0 MiB"));
}

TEST(MemoryHtml, TheTallestBarOrMeasuredLineSetsTheScale) {
  MemoryBar low = bar("low", 0, 20 * kMiB), measured = bar("measured", 0, 0);
  measured.measured = {{"process peak", 500 * kMiB}};
  const std::string page = memory_html("t", "s", {low, measured});
  EXPECT_TRUE(has(page, "text-anchor=\"middle\">260.0 MiB</text>"));  // 240 planned + 20
  EXPECT_TRUE(has(page, "<title>process peak: 500.0 MiB</title>"));
  // 540 MiB at the top: ticks every 200 MiB, up to 400.
  EXPECT_TRUE(has(page, ">400.0 MiB</text>"));
  EXPECT_FALSE(has(page, ">600.0 MiB</text>"));
  EXPECT_FALSE(has(page, ">250.0 MiB</text>"));
}

TEST(MemoryHtml, TextIsEscapedAndLabelsSplitAtNewlines) {
  const std::string page =
      memory_html("a <b> & \"c\"", "s", {bar("batch 8 x 1\nbf16 <fast>", 0, 0)});
  EXPECT_TRUE(has(page, "<title>a &lt;b&gt; &amp; &quot;c&quot;</title>"));
  EXPECT_FALSE(has(page, "<b>"));
  EXPECT_TRUE(has(page, ">batch 8 x 1</text>"));
  EXPECT_TRUE(has(page, ">bf16 &lt;fast&gt;</text>"));
  EXPECT_TRUE(has(page, "<th>batch 8 x 1 bf16 &lt;fast&gt;</th>"));
}

}  // namespace
}  // namespace brisk::testing
