#include "watchdog/common/escape.h"

#include <algorithm>
#include <cstdio>
#include <string>
#include <string_view>

namespace ncclguard {

void AppendEscaped(std::string_view text, std::string& out) {
  for (std::size_t i = 0; i < text.size(); ++i) {
    const auto byte = static_cast<unsigned char>(text[i]);
    if (byte == '\\') {
      out += "\\\\";
    } else if (byte == '\n') {
      out += "\\n";
    } else if (byte == '\r') {
      out += "\\r";
    } else if ((byte < 0x20 && byte != '\t') || byte == 0x7f) {
      char escape[5];
      std::snprintf(escape, sizeof(escape), "\\x%02x", byte);
      out += escape;
    } else if (byte == 0xc2 && i + 1 < text.size() && static_cast<unsigned char>(text[i + 1]) >= 0x80 &&
               static_cast<unsigned char>(text[i + 1]) <= 0x9f) {
      // U+0080..U+009F: C1 controls, CSI (U+009B) among them.
      char escape[7];
      std::snprintf(escape, sizeof(escape), "\\u%04x", static_cast<unsigned char>(text[++i]));
      out += escape;
    } else {
      out += text[i];
    }
  }
}

std::string EscapeControlCharacters(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  AppendEscaped(text, out);
  return out;
}

std::string RemoveUrlCredentials(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  std::size_t copied = 0;
  for (std::size_t scheme = text.find("://"); scheme != std::string_view::npos;
       scheme = text.find("://", scheme + 3)) {
    const std::size_t authority = scheme + 3;
    const std::size_t end = std::min(text.size(), text.find_first_of("/?# \t\n", authority));
    const std::size_t at = text.substr(authority, end - authority).rfind('@');
    if (at == std::string_view::npos) continue;
    out.append(text.substr(copied, authority - copied));
    out += "<redacted>";
    copied = authority + at;  // the '@' and the host are kept
  }
  out.append(text.substr(copied));
  return out;
}

}  // namespace ncclguard
