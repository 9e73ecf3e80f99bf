// Reading a status (job_dir.h's FormatStatus) back. When one rank stalls, every status of the job
// is read, 131,072 of them in a job of that size: they are parsed with simdjson, which reads a
// document at memory speed, where a DOM of nlohmann's costs about 150 instructions a byte. Dumps,
// read far fewer at a time, stay with snapshot_json.h; statuses are written there too.
#pragma once

#include <string>

#include "watchdog/report/job_dir.h"

namespace ncclguard {

// The status `content` (its checksum already checked), read from `file`. Throws an exception
// derived from std::exception on a document of the wrong shape, type or format version.
PeerStatus ReadStatusDocument(const std::string& file, const std::string& content);

// A facts record (job_dir.h's FormatStatusFacts) read into `facts`; throws as ReadStatusDocument.
void ReadStatusFactsDocument(const std::string& content, ProcessFacts& facts);

// Has simdjson choose its implementation now. Its implementation objects are statics made at the
// first parse and destroyed at exit in the reverse order of their making: made before ncclguard's
// exit hooks are registered, they are destroyed after those hooks have run.
void ChooseStatusParser() noexcept;

}  // namespace ncclguard
