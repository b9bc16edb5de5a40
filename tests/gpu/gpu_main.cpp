// The doctest runner of the 'gpu' suite: exits with 77 (Meson's "skipped") when this machine
// has no usable CUDA device, so CI without a GPU reports the GPU tests as skipped, not passed.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include "../doctest_runner.hpp"

#include <cstdio>
#include <string>

#include "ringzero/primitive/cudart/runtime.hpp"

DOCTEST_REGISTER_LISTENER("ringzero_test_case_counter", 1, ringzero_test::test_case_counter);

int main(int argc, char** argv) {
  std::string why;
  if (ringzero::primitive::cudart::device_count(&why) == 0) {
    std::printf("skipped: no CUDA device (%s)\n", why.c_str());
    return 77;
  }
  doctest::Context context(argc, argv);
  return ringzero_test::run_doctest(context);
}
