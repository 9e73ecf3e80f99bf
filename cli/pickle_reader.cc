#include "cli/pickle_reader.h"

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace ncclguard {

const PickleValue* PickleValue::Find(std::string_view key) const {
  if (kind != Kind::kDict) return nullptr;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    if (keys[i].kind == Kind::kString && keys[i].text == key) return &values[i];
  }
  return nullptr;
}

namespace {

// The values a pickle builds live in an arena and refer to each other by index, as Python's objects
// do by reference: a list the memo holds may still grow after it was memoized, and a later BINGET
// must see it whole. The tree is made from the arena once the pickle has stopped.
struct Node {
  PickleValue::Kind kind = PickleValue::Kind::kNone;
  bool boolean = false;
  std::int64_t integer = 0;
  double number = 0;
  std::string text;
  std::vector<std::uint32_t> children;  // a list's or tuple's items; a dict's keys and values, alternating
};

class Reader {
 public:
  Reader(std::string_view data, const PickleLimits& limits) : data_(data), limits_(limits) {}

  absl::StatusOr<PickleValue> Run() {
    while (true) {
      if (at_ >= data_.size()) return Cut();
      const auto opcode = static_cast<unsigned char>(data_[at_++]);
      if (opcode == '.') break;  // STOP
      if (absl::Status status = Step(opcode); !status.ok()) return status;
    }
    if (stack_.size() != 1 || !marks_.empty()) return Bad("the pickle stopped with other than one value");
    std::size_t made = 0;
    return Materialize(stack_.back(), 0, made);
  }

 private:
  static absl::Status Bad(std::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("pickle: ", std::string(why)));
  }
  static absl::Status Cut() { return Bad("cut off"); }

  // The next `n` bytes, or nothing when the data ends first.
  bool Take(std::size_t n, std::string_view& bytes) {
    if (n > data_.size() - at_) return false;
    bytes = data_.substr(at_, n);
    at_ += n;
    return true;
  }
  bool Unsigned(std::size_t n, std::uint64_t& value) {
    std::string_view bytes;
    if (!Take(n, bytes)) return false;
    value = 0;
    for (std::size_t i = n; i-- > 0;) value = (value << 8) | static_cast<unsigned char>(bytes[i]);
    return true;
  }

  std::uint32_t Push(Node node) {
    arena_.push_back(std::move(node));
    stack_.push_back(static_cast<std::uint32_t>(arena_.size() - 1));
    return stack_.back();
  }
  absl::StatusOr<std::uint32_t> Pop() {
    if (stack_.size() <= (marks_.empty() ? 0 : marks_.back()))
      return Bad("a value was taken from an empty stack");
    const std::uint32_t top = stack_.back();
    stack_.pop_back();
    return top;
  }
  // The values pushed since the last MARK, which is removed.
  absl::StatusOr<std::vector<std::uint32_t>> PopMark() {
    if (marks_.empty()) return Bad("no MARK");
    std::vector<std::uint32_t> items(stack_.begin() + static_cast<std::ptrdiff_t>(marks_.back()),
                                     stack_.end());
    stack_.resize(marks_.back());
    marks_.pop_back();
    return items;
  }
  absl::StatusOr<Node*> Top(PickleValue::Kind kind) {
    if (stack_.size() <= (marks_.empty() ? 0 : marks_.back())) return Bad("a container was expected");
    Node& top = arena_[stack_.back()];
    if (top.kind != kind) return Bad("a value was added to what cannot hold it");
    return &top;
  }

  absl::Status Scalar(PickleValue::Kind kind, std::int64_t integer = 0, bool boolean = false) {
    Node node;
    node.kind = kind;
    node.integer = integer;
    node.boolean = boolean;
    Push(std::move(node));
    return absl::OkStatus();
  }
  absl::Status Text(PickleValue::Kind kind, std::size_t length_bytes) {
    std::uint64_t length = 0;
    std::string_view bytes;
    if (!Unsigned(length_bytes, length) || !Take(length, bytes)) return Cut();
    Node node;
    node.kind = kind;
    node.text = std::string(bytes);
    Push(std::move(node));
    return absl::OkStatus();
  }
  absl::Status Integer(std::size_t bytes, bool is_signed) {
    std::uint64_t value = 0;
    if (!Unsigned(bytes, value)) return Cut();
    std::int64_t integer = static_cast<std::int64_t>(value);
    if (is_signed && bytes < 8 && (value >> (bytes * 8 - 1)) != 0)
      integer -= static_cast<std::int64_t>(1) << (bytes * 8);
    return Scalar(PickleValue::Kind::kInt, integer);
  }
  absl::Status Long1() {
    std::uint64_t length = 0;
    if (!Unsigned(1, length)) return Cut();
    if (length > 8) return Bad("an integer of more than 64 bits");
    if (length == 0) return Scalar(PickleValue::Kind::kInt, 0);
    return Integer(length, true);
  }
  absl::Status Float() {
    std::uint64_t bits = 0;
    std::string_view bytes;
    if (!Take(8, bytes)) return Cut();
    for (const char byte : bytes) bits = (bits << 8) | static_cast<unsigned char>(byte);  // big-endian
    double number = 0;
    std::memcpy(&number, &bits, sizeof(number));
    Node node;
    node.kind = PickleValue::Kind::kFloat;
    node.number = number;
    Push(std::move(node));
    return absl::OkStatus();
  }
  absl::Status Container(PickleValue::Kind kind, std::vector<std::uint32_t> children) {
    Node node;
    node.kind = kind;
    node.children = std::move(children);
    if (kind == PickleValue::Kind::kDict && node.children.size() % 2 != 0)
      return Bad("a key without a value");
    Push(std::move(node));
    return absl::OkStatus();
  }
  absl::Status Add(PickleValue::Kind kind, std::vector<std::uint32_t> children) {
    absl::StatusOr<Node*> container = Top(kind);
    if (!container.ok()) return container.status();
    if (kind == PickleValue::Kind::kDict && children.size() % 2 != 0) return Bad("a key without a value");
    (*container)->children.insert((*container)->children.end(), children.begin(), children.end());
    return absl::OkStatus();
  }
  absl::Status AddOne(PickleValue::Kind kind, std::size_t count) {
    std::vector<std::uint32_t> children(count);
    for (std::size_t i = count; i-- > 0;) {
      absl::StatusOr<std::uint32_t> value = Pop();
      if (!value.ok()) return value.status();
      children[i] = *value;
    }
    return Add(kind, std::move(children));
  }
  absl::Status Tuple(std::size_t count) {
    std::vector<std::uint32_t> children(count);
    for (std::size_t i = count; i-- > 0;) {
      absl::StatusOr<std::uint32_t> value = Pop();
      if (!value.ok()) return value.status();
      children[i] = *value;
    }
    return Container(PickleValue::Kind::kTuple, std::move(children));
  }
  absl::Status FromMark(PickleValue::Kind kind, bool into_top) {
    absl::StatusOr<std::vector<std::uint32_t>> items = PopMark();
    if (!items.ok()) return items.status();
    return into_top ? Add(kind, *std::move(items)) : Container(kind, *std::move(items));
  }
  absl::Status Put(std::size_t index_bytes, bool next_index) {
    std::uint64_t index = memo_.size();
    if (!next_index && !Unsigned(index_bytes, index)) return Cut();
    if (stack_.empty()) return Bad("nothing to memoize");
    memo_[index] = stack_.back();
    return absl::OkStatus();
  }
  absl::Status Get(std::size_t index_bytes) {
    std::uint64_t index = 0;
    if (!Unsigned(index_bytes, index)) return Cut();
    const auto found = memo_.find(index);
    if (found == memo_.end()) return Bad("a memo entry that was never made");
    stack_.push_back(found->second);
    return absl::OkStatus();
  }

  absl::Status Step(unsigned char opcode);
  // The opcodes that push one value; nothing for the others.
  std::optional<absl::Status> StepScalar(unsigned char opcode);
  // Containers, marks and the memo.
  absl::Status StepStructure(unsigned char opcode);

  absl::StatusOr<PickleValue> Materialize(std::uint32_t index, std::size_t depth, std::size_t& made) const {
    if (depth > limits_.max_depth) return Bad("nested too deeply (or a value that contains itself)");
    if (++made > limits_.max_values) return Bad("too many values");
    const Node& node = arena_[index];
    PickleValue value;
    value.kind = node.kind;
    value.boolean = node.boolean;
    value.integer = node.integer;
    value.number = node.number;
    value.text = node.text;
    const bool dict = node.kind == PickleValue::Kind::kDict;
    for (std::size_t i = 0; i < node.children.size(); i += dict ? 2 : 1) {
      absl::StatusOr<PickleValue> child = Materialize(node.children[i], depth + 1, made);
      if (!child.ok()) return child.status();
      if (!dict) {
        value.items.push_back(*std::move(child));
        continue;
      }
      absl::StatusOr<PickleValue> entry = Materialize(node.children[i + 1], depth + 1, made);
      if (!entry.ok()) return entry.status();
      value.keys.push_back(*std::move(child));
      value.values.push_back(*std::move(entry));
    }
    return value;
  }

  std::string_view data_;
  PickleLimits limits_;
  std::size_t at_ = 0;
  std::vector<Node> arena_;
  std::vector<std::uint32_t> stack_;
  std::vector<std::size_t> marks_;
  std::unordered_map<std::uint64_t, std::uint32_t> memo_;
};

absl::Status Reader::Step(unsigned char opcode) {
  if (std::optional<absl::Status> done = StepScalar(opcode)) return *std::move(done);
  return StepStructure(opcode);
}

std::optional<absl::Status> Reader::StepScalar(unsigned char opcode) {
  using Kind = PickleValue::Kind;
  std::string_view skipped;
  switch (opcode) {
    case 0x80:  // PROTO
      return Take(1, skipped) ? absl::OkStatus() : Cut();
    case 0x95:  // FRAME: a length hint only
      return Take(8, skipped) ? absl::OkStatus() : Cut();
    case 'N':
      return Scalar(Kind::kNone);
    case 0x88:  // NEWTRUE
      return Scalar(Kind::kBool, 0, true);
    case 0x89:  // NEWFALSE
      return Scalar(Kind::kBool, 0, false);
    case 'J':  // BININT
      return Integer(4, true);
    case 'K':  // BININT1
      return Integer(1, false);
    case 'M':  // BININT2
      return Integer(2, false);
    case 0x8a:  // LONG1
      return Long1();
    case 'G':  // BINFLOAT
      return Float();
    case 'X':  // BINUNICODE
      return Text(Kind::kString, 4);
    case 0x8c:  // SHORT_BINUNICODE
      return Text(Kind::kString, 1);
    case 0x8d:  // BINUNICODE8
      return Text(Kind::kString, 8);
    case 'T':  // BINSTRING
      return Text(Kind::kString, 4);
    case 'U':  // SHORT_BINSTRING
      return Text(Kind::kString, 1);
    case 'B':  // BINBYTES
      return Text(Kind::kBytes, 4);
    case 'C':  // SHORT_BINBYTES
      return Text(Kind::kBytes, 1);
    default:
      return std::nullopt;
  }
}

absl::Status Reader::StepStructure(unsigned char opcode) {
  using Kind = PickleValue::Kind;
  switch (opcode) {
    case ']':  // EMPTY_LIST
      return Container(Kind::kList, {});
    case ')':  // EMPTY_TUPLE
      return Container(Kind::kTuple, {});
    case '}':  // EMPTY_DICT
      return Container(Kind::kDict, {});
    case 'a':  // APPEND
      return AddOne(Kind::kList, 1);
    case 's':  // SETITEM
      return AddOne(Kind::kDict, 2);
    case 'e':  // APPENDS
      return FromMark(Kind::kList, true);
    case 'u':  // SETITEMS
      return FromMark(Kind::kDict, true);
    case 'l':  // LIST
      return FromMark(Kind::kList, false);
    case 't':  // TUPLE
      return FromMark(Kind::kTuple, false);
    case 'd':  // DICT
      return FromMark(Kind::kDict, false);
    case 0x85:  // TUPLE1
    case 0x86:  // TUPLE2
    case 0x87:  // TUPLE3
      return Tuple(opcode - 0x84);
    case '(':  // MARK
      marks_.push_back(stack_.size());
      return absl::OkStatus();
    case '0':  // POP
      return Pop().status();
    case '1':  // POP_MARK
      return PopMark().status();
    case '2':  // DUP
      if (stack_.empty()) return Bad("nothing to duplicate");
      stack_.push_back(stack_.back());
      return absl::OkStatus();
    case 'q':  // BINPUT
      return Put(1, false);
    case 'r':  // LONG_BINPUT
      return Put(4, false);
    case 0x94:  // MEMOIZE
      return Put(0, true);
    case 'h':  // BINGET
      return Get(1);
    case 'j':  // LONG_BINGET
      return Get(4);
    default:
      return Bad(absl::StrCat("opcode 0x", absl::Hex(opcode), " is not read (it is no plain data)"));
  }
}

}  // namespace

absl::StatusOr<PickleValue> ReadPickle(std::string_view data, const PickleLimits& limits) {
  return Reader(data, limits).Run();
}

}  // namespace ncclguard
