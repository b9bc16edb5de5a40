#pragma once
// The doctest runner's guard shared by every test executable's main (tests/main.cpp, the MPI and
// GPU mains). Several Meson tests run one executable with a filter (--source-file=*name.cpp: a
// unity-built executable holds a directory's test files); a filter that matches nothing would
// make doctest report success having run nothing, so run_doctest fails such a run instead.
#include <doctest/doctest.h>

#include <cstdio>

namespace ringzero_test {

/// Counts the test cases doctest starts (a doctest listener: it sees every run, reports nothing).
struct test_case_counter : doctest::IReporter {
  explicit test_case_counter(const doctest::ContextOptions&) {}
  static inline int started = 0;
  void report_query(const doctest::QueryData&) override {}
  void test_run_start() override {}
  void test_run_end(const doctest::TestRunStats&) override {}
  void test_case_start(const doctest::TestCaseData&) override { ++started; }
  void test_case_reenter(const doctest::TestCaseData&) override {}
  void test_case_end(const doctest::CurrentTestCaseStats&) override {}
  void test_case_exception(const doctest::TestCaseException&) override {}
  void subcase_start(const doctest::SubcaseSignature&) override {}
  void subcase_end() override {}
  void log_assert(const doctest::AssertData&) override {}
  void log_message(const doctest::MessageData&) override {}
  void test_case_skipped(const doctest::TestCaseData&) override {}
};

/// Runs `context`; a run that started no test case (its filters matched nothing) fails with a
/// message, unless doctest was only asked a query (--list-test-cases, --help, ...).
inline int run_doctest(doctest::Context& context) {
  const int status = context.run();
  if (context.shouldExit()) return status;
  if (test_case_counter::started == 0) {
    std::fprintf(stderr, "no test case ran: the filters given match none (a test that runs nothing cannot fail)\n");
    return 1;
  }
  return status;
}

}  // namespace ringzero_test
