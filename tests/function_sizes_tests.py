"""scripts/function_sizes.py counts a function's lines as clang-tidy's readability-function-size.

function_sizes_tests.py <scripts/function_sizes.py>
"""
import importlib.util
import os
import sys
import tempfile
import unittest

_spec = importlib.util.spec_from_file_location("function_sizes", sys.argv.pop(1))
function_sizes = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(function_sizes)


def body(lines):
    return "\n".join(f"  x += {i};" for i in range(lines - 1))


def sizes(source, bound):
    with tempfile.NamedTemporaryFile("w", suffix=".cc", delete=False) as file:
        file.write(source)
    try:
        return [(name, lines) for _, name, lines in function_sizes.long_functions(file.name, bound)]
    finally:
        os.unlink(file.name)


class FunctionSizes(unittest.TestCase):
    def test_counts_from_the_opening_brace_to_the_closing_one(self):
        source = "int F(int x) {\n" + body(5) + "\n  return x;\n}\n"
        self.assertEqual(sizes(source, 5), [("F", 6)])
        self.assertEqual(sizes(source, 6), [])

    def test_finds_methods_in_classes_and_namespaces(self):
        source = ("namespace a {\nnamespace {\nclass C : public B {\n public:\n  int M(int x) const override {\n"
                  + body(10) + "\n  }\n};\n}  // namespace\n}  // namespace a\n")
        self.assertEqual(sizes(source, 5), [("M", 10)])

    def test_a_constructor_with_braced_initializers(self):
        source = "C::C(int x)\n    : a_{x},\n      b_(x) {\n" + body(8) + "\n}\n"
        self.assertEqual(sizes(source, 5), [("C::C", 8)])

    def test_lambdas_and_control_statements_count_toward_their_function(self):
        source = ("void F() {\n  auto g = [&](int y) {\n" + body(4) + "\n  };\n  if (x) {\n" + body(4)
                  + "\n  }\n}\n")
        self.assertEqual(sizes(source, 5), [("F", 11)])

    def test_braces_in_comments_strings_and_macros_are_not_counted(self):
        source = ('void F() {\n  // }\n  const char* s = "}}";\n  char c = \'}\';\n'
                  '  auto r = R"(}\n})";\n#define X }\n  /* } */\n' + body(6) + "\n}\n")
        self.assertEqual(sizes(source, 5), [("F", 13)])

    def test_tables_and_declarations_are_not_functions(self):
        source = ("constexpr int kTable[] = {\n" + ",\n".join(["1"] * 20) + "};\nstruct S {\n"
                  + "\n".join(f"  int m{i};" for i in range(20)) + "\n};\nvoid G();\n")
        self.assertEqual(sizes(source, 5), [])


if __name__ == "__main__":
    unittest.main()
