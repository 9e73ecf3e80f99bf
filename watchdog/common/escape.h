// Text that came from outside ncclguard (host names, setting values, file contents, NCCL's
// messages) made safe for a human reader's terminal: one line, no terminal control sequences.
#pragma once

#include <string>
#include <string_view>

namespace ncclguard {

// Control characters (C0 but tab, DEL, and C1 encoded in UTF-8) become visible escapes: newline
// `\n`, carriage return `\r`, ESC `\x1b`; and a backslash becomes `\\`, so that an escape cannot be
// forged either. Everything else, UTF-8 included, is kept.
std::string EscapeControlCharacters(std::string_view text);
void AppendEscaped(std::string_view text, std::string& out);

// `text` with the user and password of every URL in it (scheme://user:password@host) replaced by
// `<redacted>`: settings and addresses are logged and stored in dumps, which others may read.
std::string RemoveUrlCredentials(std::string_view text);

}  // namespace ncclguard
