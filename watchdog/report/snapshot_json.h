// The JSON form of each snapshot type (snapshot.h), written into dumps and status files and read
// back from dumps (docs/dump-format.md; statuses are read by status_reader.h), made from each type's
// table of fields (snapshot_fields.h). A status file carries less than a dump, which the writers and
// readers say with a SnapshotDocument or an OpFields.
//
// Reading is for files ncclguard did not necessarily write: from_json checks the type of every
// field it reads, sizes nothing by a number read from the file, and throws nlohmann::json's
// exceptions or std::runtime_error, which every reader turns into a problem.
#pragma once

#include <cstddef>
#include <vector>

#include <nlohmann/json.hpp>

#include "watchdog/report/snapshot.h"

namespace ncclguard {

// The document a communicator or stall is written into or read from.
enum class SnapshotDocument {
  kDump,    // everything
  kStatus,  // what peers compare: progress, the operations around it, signatures; no ring
};

// Which fields of an operation a document carries, in the order they are written.
enum class OpFields {
  kAll,          // a dump's ring entry
  kDescription,  // what was asked (a status file's last_completed_op)
  kOutstanding,  // what was asked, its state and times (a status file's oldest_outstanding)
};

// Every field of an operation, as a dump's ring entry; absent fields are left at their defaults.
void to_json(nlohmann::ordered_json& json, const OpSnapshot& op);
void from_json(const nlohmann::json& json, OpSnapshot& op);
nlohmann::ordered_json OpJson(const OpSnapshot& op, OpFields fields);
// Throws unless the fields that `fields` always carries are present.
OpSnapshot ReadOp(const nlohmann::json& json, OpFields fields);

// A communicator as a dump writes it (its progress then lives in the watchdog's section, below),
// or as a status file does: progress, last completed and oldest outstanding operations (taken from
// the ring) and operation signatures. Statuses are read by status_reader.h.
nlohmann::ordered_json CommJson(const CommSnapshot& comm, SnapshotDocument document);
CommSnapshot ReadComm(const nlohmann::json& json);                     // as in a dump
void to_json(nlohmann::ordered_json& json, const CommSnapshot& comm);  // as in a dump
void from_json(const nlohmann::json& json, CommSnapshot& comm);        // as in a dump

// A dump's watchdog.progress entry for `comm`, and reading one into the matching communicator of
// `comms` (same id and rank).
nlohmann::ordered_json ProgressJson(const CommSnapshot& comm);
void ReadProgress(const nlohmann::json& json, std::vector<CommSnapshot>& comms);

// A status file's stall leaves out the message and the verdict's sentence.
nlohmann::ordered_json StallJson(const StallSnapshot& stall, SnapshotDocument document);
StallSnapshot ReadStall(const nlohmann::json& json);                     // as in a dump
void to_json(nlohmann::ordered_json& json, const StallSnapshot& stall);  // as in a dump
void from_json(const nlohmann::json& json, StallSnapshot& stall);        // as in a dump

// The same in dumps and status files.
void to_json(nlohmann::ordered_json& json, const PendingInitSnapshot& init);
void from_json(const nlohmann::json& json, PendingInitSnapshot& init);

// A dump's "threads" section. Frames are written until `frame_budget_bytes` of them are; the
// threads after that are listed without frames (frames_omitted), so that many threads with deep
// stacks cannot push a dump past what readers accept.
nlohmann::ordered_json ThreadsJson(const ThreadsSnapshot& threads, std::size_t frame_budget_bytes);
ThreadsSnapshot ReadThreads(const nlohmann::json& json);

// `json`, which must be an array (iterating over anything else would visit its values).
const nlohmann::json& CheckedArray(const nlohmann::json& json);

// An array's elements, each read by `read`, one at a time: nothing is reserved by the claimed size.
template <typename Read>
auto ReadArray(const nlohmann::json& json, Read read) {
  std::vector<decltype(read(json))> elements;
  for (const nlohmann::json& element : CheckedArray(json)) elements.push_back(read(element));
  return elements;
}

}  // namespace ncclguard
