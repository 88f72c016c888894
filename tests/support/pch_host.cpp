// SPDX-License-Identifier: Apache-2.0
// The target that compiles the tests' precompiled header (tests/CMakeLists.txt);
// the header itself is all it is for.
int main() { return 0; }
