// Algorithm selection is unchanged by the algorithm descriptors: every line of
// data/selection_table.txt (captured from the selection code before the descriptors; see
// selection_sweep.hpp) is recomputed with the current code and must be identical: the chosen
// algorithm for each (backend profile, collective, dtype, op, world size, count), the resolved
// algorithm for each (requested, forced) pair, and every cost estimate bit for bit.
#include <doctest/doctest.h>

#include <fstream>
#include <string>
#include <vector>

#include "selection_sweep.hpp"

#ifndef RZT_SELECTION_TABLE
#error "RZT_SELECTION_TABLE must name tests/collective/data/selection_table.txt"
#endif

TEST_CASE("selection and cost estimates match the table captured before the algorithm descriptors") {
  std::ifstream in(RZT_SELECTION_TABLE);
  REQUIRE(in.good());
  std::vector<std::string> expected;
  for (std::string line; std::getline(in, line);) expected.push_back(line);
  const std::vector<std::string> actual = rzt::selection_sweep_lines();
  REQUIRE(expected.size() > 5000);
  CHECK(actual.size() == expected.size());
  int reported = 0;
  std::size_t differing = 0;
  for (std::size_t i = 0; i < actual.size() && i < expected.size(); ++i) {
    if (actual[i] == expected[i]) continue;
    ++differing;
    if (reported++ < 10) {
      INFO("line " << i + 1);
      CHECK(actual[i] == expected[i]);
    }
  }
  CHECK(differing == 0);
}
