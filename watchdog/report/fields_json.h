// The nlohmann::json writer and reader made from a table of fields (snapshot_fields.h), for the
// dump's records (snapshot_json.cc) and facts (dump.cc, dump_reader.cc).
#pragma once

#include <stdexcept>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "watchdog/report/snapshot_fields.h"

namespace ncclguard {

// `record`'s fields of `fields` that a document of `set` carries, in the table's order.
template <typename JsonType, typename Record, typename Fields>
void WriteFields(JsonType& json, const Record& record, const Fields& fields, FieldSet set) {
  ForEachField(fields, [&](const auto& field) {
    if ((field.in & set.written) != 0 && !field.Skipped(record))
      json[field.name.data()] = field.Encode(record);
  });
}

template <typename JsonType = nlohmann::ordered_json, typename Record, typename Fields>
JsonType Written(const Record& record, const Fields& fields, FieldSet set) {
  JsonType json = JsonType::object();
  WriteFields(json, record, fields, set);
  return json;
}

template <typename Record, typename Fields>
nlohmann::ordered_json WrittenArray(const std::vector<Record>& records, const Fields& fields, FieldSet set) {
  nlohmann::ordered_json array = nlohmann::ordered_json::array();
  for (const Record& record : records) array.push_back(Written(record, fields, set));
  return array;
}

// `record` as an array of every field's value, in the table's order: for records a status carries
// by the thousand, whose names would double its size.
template <typename Record, typename Fields>
nlohmann::ordered_json WrittenPositionally(const Record& record, const Fields& fields) {
  nlohmann::ordered_json array = nlohmann::ordered_json::array();
  ForEachField(fields, [&](const auto& field) { array.push_back(field.Encode(record)); });
  return array;
}

// Reads what WrittenPositionally wrote; an array too short is nlohmann's out_of_range.
template <typename Record, typename Fields>
void ReadPositionally(const nlohmann::json& array, Record& record, const Fields& fields) {
  if (!array.is_array())
    throw std::runtime_error(absl::StrCat("an array was expected, not ", array.type_name()));
  std::size_t index = 0;
  ForEachField(fields, [&](const auto& field) {
    using Wire = typename std::decay_t<decltype(field)>::Wire;
    field.Decode(array.at(index++).template get<Wire>(), record);
  });
}

// Reads the fields of `fields` that a document of `set` carries into `record`: those present
// (nlohmann's type_error when of the wrong type); throws when a required one is absent.
template <typename Record, typename Fields>
void ReadFields(const nlohmann::json& json, Record& record, const Fields& fields, FieldSet set) {
  if (!json.is_object())
    throw std::runtime_error(absl::StrCat("an object was expected, not ", json.type_name()));
  ForEachField(fields, [&](const auto& field) {
    if ((field.in & set.written) == 0) return;
    const auto found = json.find(field.name.data());
    if (found == json.end()) {
      if ((field.in & set.required) != 0)
        throw std::runtime_error(
            absl::StrCat("key '", absl::string_view(field.name.data(), field.name.size()), "' not found"));
      return;
    }
    using Wire = typename std::decay_t<decltype(field)>::Wire;
    field.Decode(found->template get<Wire>(), record);
  });
}

template <typename Record, typename Fields>
Record ReadRecord(const nlohmann::json& json, const Fields& fields, FieldSet set) {
  Record record;
  ReadFields(json, record, fields, set);
  return record;
}

}  // namespace ncclguard
