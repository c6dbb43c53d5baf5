// SentencePiece tokenizer.model files (Llama-2, Mistral, T5's originals) through libsentencepiece:
// the library normalizes, adds the "▁" prefix and encodes (BPE or unigram, byte fallback) exactly
// as the Python `sentencepiece` package does; brisk adds the special tokens around it.
#include <sentencepiece_processor.h>

#include <string>
#include <unordered_map>
#include <vector>

#include "core/error.h"
#include "tokenizer/charsmap.h"
#include "tokenizer/tokenizer.h"

namespace brisk {

namespace {

std::unordered_map<std::string, int32_t> pieces_of(const sentencepiece::SentencePieceProcessor& sp,
                                                   const std::string& origin) {
  std::unordered_map<std::string, int32_t> vocab;
  const int n = sp.GetPieceSize();
  BRISK_CHECK(n > 0, "'", origin, "': the SentencePiece model has no pieces");
  for (int id = 0; id < n; ++id) vocab.emplace(sp.IdToPiece(id), id);
  return vocab;
}

class SentencePieceModel final : public TokenModel {
 public:
  SentencePieceModel(std::unique_ptr<sentencepiece::SentencePieceProcessor> sp,
                     const std::string& origin)
      : TokenModel(pieces_of(*sp, origin)), sp_(std::move(sp)) {}

  // The library's Encode is const and thread-safe; it reports failures by status, never throws.
  void encode(std::string_view text, std::vector<int32_t>& out) const override {
    std::string repaired;
    const std::string_view valid = valid_utf8(text, repaired);
    std::vector<int> ids;
    if (!sp_->Encode(valid, &ids).ok()) return;  // only an unloaded model fails
    out.insert(out.end(), ids.begin(), ids.end());
  }

  // The library's decoding ("▁" as spaces, byte pieces as bytes, control pieces as nothing).
  std::string decode(const std::vector<int32_t>& ids) const override {
    std::vector<int> known;
    for (int32_t id : ids)
      if (id >= 0 && id < sp_->GetPieceSize()) known.push_back(id);
    std::string out;
    if (!sp_->Decode(known, &out).ok()) out.clear();
    return out;
  }

  int32_t special_id(SentencePieceSpecial which) const {
    switch (which) {
      case SentencePieceSpecial::kUnknown:
        return sp_->unk_id();
      case SentencePieceSpecial::kBegin:
        return sp_->bos_id();
      case SentencePieceSpecial::kEnd:
        return sp_->eos_id();
      case SentencePieceSpecial::kPad:
        return sp_->pad_id();
    }
    return -1;
  }

 private:
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
};

}  // namespace

std::unique_ptr<TokenModel> make_sentencepiece(const std::string& serialized,
                                               const std::string& origin,
                                               std::array<int32_t, 4>& special_ids) {
  // The library checks only the charsmap's size prefix before walking its trie.
  check_sentencepiece_charsmaps(serialized, origin);
  auto sp = std::make_unique<sentencepiece::SentencePieceProcessor>();
  const auto status = sp->LoadFromSerializedProto(serialized);
  if (!status.ok()) {
    // The library names its own source line when the protobuf does not parse: say it plainly.
    std::string why = status.message();
    if (why.find("ParseFromArray") != std::string::npos) why = "the file does not parse";
    while (!why.empty() && why.back() == ' ') why.pop_back();
    BRISK_FAIL("'", origin, "' is not a valid SentencePiece model: ", excerpt(why, 200));
  }
  auto model = std::make_unique<SentencePieceModel>(std::move(sp), origin);
  for (auto which : {SentencePieceSpecial::kUnknown, SentencePieceSpecial::kBegin,
                     SentencePieceSpecial::kEnd, SentencePieceSpecial::kPad})
    special_ids[static_cast<size_t>(which)] = model->special_id(which);
  return model;
}

}  // namespace brisk
