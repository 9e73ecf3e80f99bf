// A writer of Python pickles (protocol 2) for the files that other tools read with pickle.load:
// PyTorch's Flight Recorder dumps (flight_recorder.h). Plain data only: None, booleans, integers,
// floats, strings, lists, tuples and dicts, each written in full (no memo, which pickle.load does
// not need). Protocol 2 is what every Python 3 reads; its opcodes are listed in CPython's
// Lib/pickletools.py.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace ncclguard {

class PickleWriter {
 public:
  PickleWriter();  // the protocol header

  void None();
  void Bool(bool value);
  void Int(std::int64_t value);
  void Float(double value);
  // A str; bytes that are not UTF-8 become U+FFFD, as Python's errors="replace" would make them,
  // since pickle.load refuses a str that is not UTF-8.
  void String(std::string_view text);

  // Containers: their items go between Begin and End; a dict's are key, value, key, value...
  void BeginList();
  void EndList();
  void BeginTuple();
  void EndTuple();
  void BeginDict();
  void EndDict();

  // The pickle, ended with STOP. Every container begun must have ended.
  std::string Finish();

 private:
  void Opcode(char opcode) { out_.push_back(opcode); }
  void LittleEndian(std::uint64_t value, int bytes);
  std::string out_;
  int depth_ = 0;
};

// `text` with every byte that is not part of well-formed UTF-8 replaced by U+FFFD.
std::string ValidUtf8(std::string_view text);

}  // namespace ncclguard
