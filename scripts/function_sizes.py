#!/usr/bin/env python3
"""Lists the functions longer than a bound in C++ files formatted by the project's .clang-format.

    scripts/function_sizes.py [--max 80] FILE...

A function's length is counted as clang-tidy's readability-function-size counts it: the lines
from its body's opening brace to its closing one, less one. Comments, string and character
literals (raw strings too) and preprocessor lines are blanked before the braces are matched; a
brace opens a function body when what precedes it since the previous statement ends with a
parameter list (and qualifiers, a trailing return type or a constructor's initializers). Lambdas
and local classes count toward the function holding them. Prints `file:line: name: N lines` for
each function over the bound; exits 1 if there is one.
"""
import argparse
import re
import sys

_CONTROL = re.compile(r"\b(if|for|while|switch|catch|do|else|try|return|co_return|co_yield)\s*$")
_SCOPE = re.compile(r"^(template\s*<.*>\s*)?(export\s+)?(class|struct|union|namespace|enum)\b|^extern\s*\"C\"", re.S)
_QUALIFIERS = re.compile(
    r"\)\s*((const|volatile|noexcept|override|final|mutable|constexpr|&&|&|"
    r"noexcept\s*\([^()]*(\([^()]*\))*[^()]*\)|requires\b[^{;]*|->\s*[^{;]+)\s*)*$",
    re.S)
_INITIALIZERS = re.compile(r"\)\s*(noexcept\s*)?:\s*[A-Za-z_:]")


def blank(text):
    """The text with comments, literals and preprocessor lines replaced by spaces (lines kept)."""
    out = []
    i, n = 0, len(text)
    line_start = True
    while i < n:
        c = text[i]
        if line_start and c == "#":
            j = i
            while j < n and text[j] != "\n":  # a directive, with its continuation lines
                j += 2 if text[j] == "\\" and j + 1 < n else 1
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
            continue
        if c == "\n":
            line_start = True
            out.append(c)
            i += 1
            continue
        if not c.isspace():
            line_start = False
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == "R" and text.startswith('R"', i) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")) \
                or (c in "uUL8" and re.match(r'(u8|u|U|L)R"', text[i:i + 4])):
            start = text.index('"', i)
            paren = text.index("(", start)
            end = text.index(")" + text[start + 1:paren] + '"', paren) + paren - start + 1
            j = end + 1
            out.append('""' + re.sub(r"[^\n]", " ", text[i + 2:j]))
            i = j
        elif c == '"' or (c == "'" and not (i > 0 and text[i - 1].isalnum())):  # 1'000 is a digit separator
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            j += 1
            out.append(c + " " * (j - i - 2) + c)
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _name(head):
    """The function's name: the identifier before the parameter list's opening parenthesis."""
    initializers = _INITIALIZERS.search(head)
    if initializers:
        head = head[:initializers.start() + 1]
    depth = 0
    for k in range(len(head) - 1, -1, -1):
        if head[k] == ")":
            depth += 1
        elif head[k] == "(":
            depth -= 1
            if depth == 0:
                m = re.search(r"([~A-Za-z_][\w:~<>]*|operator\s*\S+)\s*$", head[:k])
                if m and not _CONTROL.search(head[:k]):
                    return m.group(1)
    return "?"


def _is_function(head):
    head = head.strip()
    if not head or _CONTROL.search(head.split("(")[0]) or re.search(r"(^|[^\w])(if|for|while|switch|catch)\s*\(", head):
        return False
    if re.search(r"=\s*$|\breturn\b", head) or "]" in head.split("(")[0]:  # an initializer, a lambda
        return False
    return bool(_QUALIFIERS.search(head)) or bool(_INITIALIZERS.search(head) and re.search(r"[)}]\s*$", head))


def long_functions(path, bound):
    text = blank(open(path, encoding="utf-8").read())
    found = []
    line = 1
    head_start = 0
    stack = []  # per open brace: 'scope', 'function' (with start), or 'other'
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "\n":
            line += 1
        elif c in ";":
            if not stack or stack[-1][0] == "scope":
                head_start = i + 1
        elif c == "{":
            in_function = any(kind == "function" for kind, *_ in stack)
            head = text[head_start:i]
            if in_function:
                stack.append(("other",))
            elif _SCOPE.search(head.strip()) and "(" not in head.split("{")[0].split("=")[0]:
                stack.append(("scope",))
                head_start = i + 1
            elif _INITIALIZERS.search(head) and re.search(r"[\w>]\s*$", head):
                stack.append(("member-init",))  # a member's braced initializer in a constructor's list
            elif _is_function(head):
                stack.append(("function", line, _name(head)))
            else:
                stack.append(("other",))
        elif c == "}":
            entry = stack.pop() if stack else ("scope",)
            if entry[0] == "function" and line - entry[1] > bound:
                found.append((entry[1], entry[2], line - entry[1]))
            if entry[0] != "member-init" and (not stack or stack[-1][0] == "scope"):
                head_start = i + 1
        i += 1
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--max", type=int, default=80)
    parser.add_argument("files", nargs="+")
    args = parser.parse_args()
    status = 0
    for path in args.files:
        for line, name, lines in long_functions(path, args.max):
            print(f"{path}:{line}: {name}: {lines} lines, more than {args.max}: split it into named steps")
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
