// The names of the files ncclguard leaves in a job directory and the formats of their documents,
// one definition for the processes that write them and the tools that read them.
#pragma once

namespace ncclguard {

// dump-<host>-<pid>-<rank>-<n>.json (dump.h), status-<host>-<pid>.json (job_dir.h), and a dump
// request, dump-request-<host>-<pid>-<n>, which has no suffix.
inline constexpr char kDumpPrefix[] = "dump-";
inline constexpr char kStatusPrefix[] = "status-";
inline constexpr char kRequestPrefix[] = "dump-request-";
inline constexpr char kJsonSuffix[] = ".json";

// The "format" member that opens each document.
inline constexpr char kDumpFormat[] = "ncclguard-dump";
inline constexpr char kStatusFormat[] = "ncclguard-status";
inline constexpr char kStatusFactsFormat[] = "ncclguard-status-facts";
inline constexpr char kRequestFormat[] = "ncclguard-dump-request";

}  // namespace ncclguard
