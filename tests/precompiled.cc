// The owner of the test programs' precompiled headers (tests/CMakeLists.txt), compiled with no
// definition of its own so that every test program can use them.
int main() { return 0; }
