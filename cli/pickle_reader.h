// A reader of the part of Python's pickle format that PyTorch's Flight Recorder dumps are made of
// (dicts, lists, tuples, strings, integers, floats, booleans and None, with the memo; protocols 2
// to 5), for `ncclguard analyze` to read the dumps PyTorch wrote beside its own. Nothing is ever
// executed or imported: an opcode that would (GLOBAL, REDUCE, ...) makes the file unreadable. The
// file is a stranger's: every length is checked against what is left of it, and the values, the
// copies the memo makes and the nesting are bounded.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace ncclguard {

struct PickleValue {
  enum class Kind { kNone, kBool, kInt, kFloat, kString, kBytes, kList, kTuple, kDict };
  Kind kind = Kind::kNone;
  bool boolean = false;
  std::int64_t integer = 0;
  double number = 0;
  std::string text;                 // kString (UTF-8), kBytes
  std::vector<PickleValue> items;   // kList, kTuple
  std::vector<PickleValue> keys;    // kDict, in the file's order
  std::vector<PickleValue> values;  // kDict: values[i] is keys[i]'s

  // A dict's value under a string key; nullptr when there is none or this is not a dict.
  const PickleValue* Find(std::string_view key) const;
  bool IsString() const { return kind == Kind::kString; }
  bool IsInt() const { return kind == Kind::kInt; }
  bool IsSequence() const { return kind == Kind::kList || kind == Kind::kTuple; }
};

struct PickleLimits {
  std::size_t max_values = 1'000'000;  // every value made, memo copies included
  std::size_t max_depth = 64;          // open containers at once
};

// The value the pickle `data` holds, or why it cannot be read (cut off, an unsupported opcode, a
// bound reached, a length past its end).
absl::StatusOr<PickleValue> ReadPickle(std::string_view data, const PickleLimits& limits = {});

}  // namespace ncclguard
