#include "watchdog/report/pickle_writer.h"

#include <bit>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

namespace ncclguard {
namespace {

// Protocol 2's opcodes (CPython's Lib/pickletools.py).
constexpr char kProto = '\x80';
constexpr char kStop = '.';
constexpr char kMark = '(';
constexpr char kNone = 'N';
constexpr char kNewTrue = '\x88';
constexpr char kNewFalse = '\x89';
constexpr char kBinInt1 = 'K';     // an unsigned byte
constexpr char kBinInt2 = 'M';     // an unsigned 2-byte integer, little-endian
constexpr char kBinInt = 'J';      // a signed 4-byte integer, little-endian
constexpr char kLong1 = '\x8a';    // a length byte, then that many bytes of two's complement, little-endian
constexpr char kBinFloat = 'G';    // an IEEE double, big-endian
constexpr char kBinUnicode = 'X';  // a 4-byte little-endian length, then UTF-8
constexpr char kEmptyList = ']';
constexpr char kAppends = 'e';
constexpr char kTuple = 't';  // the items since the mark
constexpr char kEmptyDict = '}';
constexpr char kSetItems = 'u';

// The length of the well-formed UTF-8 sequence at text[i], 0 when there is none (RFC 3629: no
// overlong forms, no surrogates, nothing above U+10FFFF).
std::size_t Utf8SequenceLength(std::string_view text, std::size_t i) {
  const auto byte = [&](std::size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char lead = byte(i);
  if (lead < 0x80) return 1;
  std::size_t length = 0;
  unsigned char low = 0x80, high = 0xBF;  // the bounds of the second byte
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    if (lead == 0xE0) low = 0xA0;
    if (lead == 0xED) high = 0x9F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    if (lead == 0xF0) low = 0x90;
    if (lead == 0xF4) high = 0x8F;
  } else {
    return 0;
  }
  if (i + length > text.size()) return 0;
  if (byte(i + 1) < low || byte(i + 1) > high) return 0;
  for (std::size_t k = 2; k < length; ++k) {
    if (byte(i + k) < 0x80 || byte(i + k) > 0xBF) return 0;
  }
  return length;
}

}  // namespace

std::string ValidUtf8(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size();) {
    const std::size_t length = Utf8SequenceLength(text, i);
    if (length == 0) {
      out += "\xEF\xBF\xBD";
      ++i;
    } else {
      out.append(text.substr(i, length));
      i += length;
    }
  }
  return out;
}

PickleWriter::PickleWriter() {
  Opcode(kProto);
  out_.push_back('\x02');
}

void PickleWriter::LittleEndian(std::uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out_.push_back(static_cast<char>((value >> (8 * i)) & 0xFF));
}

void PickleWriter::None() { Opcode(kNone); }

void PickleWriter::Bool(bool value) { Opcode(value ? kNewTrue : kNewFalse); }

void PickleWriter::Int(std::int64_t value) {
  if (value >= 0 && value <= 0xFF) {
    Opcode(kBinInt1);
    LittleEndian(static_cast<std::uint64_t>(value), 1);
  } else if (value >= 0 && value <= 0xFFFF) {
    Opcode(kBinInt2);
    LittleEndian(static_cast<std::uint64_t>(value), 2);
  } else if (value >= INT32_MIN && value <= INT32_MAX) {
    Opcode(kBinInt);
    LittleEndian(static_cast<std::uint32_t>(static_cast<std::int32_t>(value)), 4);
  } else {
    Opcode(kLong1);
    out_.push_back('\x08');
    LittleEndian(static_cast<std::uint64_t>(value), 8);
  }
}

void PickleWriter::Float(double value) {
  Opcode(kBinFloat);
  const auto bits = std::bit_cast<std::uint64_t>(value);
  for (int i = 7; i >= 0; --i) out_.push_back(static_cast<char>((bits >> (8 * i)) & 0xFF));
}

void PickleWriter::String(std::string_view text) {
  const std::string valid = ValidUtf8(text);
  Opcode(kBinUnicode);
  LittleEndian(valid.size(), 4);
  out_ += valid;
}

void PickleWriter::BeginList() {
  Opcode(kEmptyList);
  Opcode(kMark);
  ++depth_;
}

void PickleWriter::EndList() {
  Opcode(kAppends);
  --depth_;
}

void PickleWriter::BeginTuple() {
  Opcode(kMark);
  ++depth_;
}

void PickleWriter::EndTuple() {
  Opcode(kTuple);
  --depth_;
}

void PickleWriter::BeginDict() {
  Opcode(kEmptyDict);
  Opcode(kMark);
  ++depth_;
}

void PickleWriter::EndDict() {
  Opcode(kSetItems);
  --depth_;
}

std::string PickleWriter::Finish() {
  if (depth_ != 0) throw std::logic_error("PickleWriter::Finish with a container not ended");
  Opcode(kStop);
  return std::move(out_);
}

}  // namespace ncclguard
