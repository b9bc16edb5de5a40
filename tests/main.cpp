// The doctest runner shared by the test executables: fails a run whose filters matched no test
// case (tests/doctest_runner.hpp).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include "doctest_runner.hpp"

DOCTEST_REGISTER_LISTENER("ringzero_test_case_counter", 1, ringzero_test::test_case_counter);

int main(int argc, char** argv) {
  doctest::Context context(argc, argv);
  return ringzero_test::run_doctest(context);
}
