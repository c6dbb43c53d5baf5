// SentencePiece's precompiled character map (a normalizer's rules compiled into a darts-clone
// double-array trie and the strings it maps to), checked before libsentencepiece, which checks
// only its size prefix, walks it.
#pragma once

#include <string>
#include <string_view>

namespace brisk {

// Throws naming `origin` unless `blob` is a little-endian uint32 trie size, that many bytes of
// double-array units and NUL-separated strings, where every walk from the root, on any bytes,
// reads units inside the array and every value it finds starts a NUL-terminated string.
void check_precompiled_charsmap(std::string_view blob, const std::string& origin);

// The charsmaps of a serialized SentencePiece ModelProto (its normalizer and denormalizer specs)
// checked as above; bytes that do not walk as protobuf fields are refused.
void check_sentencepiece_charsmaps(std::string_view model, const std::string& origin);

}  // namespace brisk
