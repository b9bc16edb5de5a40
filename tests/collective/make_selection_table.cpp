// Prints the selection table (selection_sweep.hpp) to stdout. It was run once, on the selection
// code before algorithms became descriptors, to write data/selection_table.txt; the table is a
// record of that behaviour, not something to regenerate when a test fails.
#include <cstdio>

#include "selection_sweep.hpp"

int main() {
  for (const std::string& line : rzt::selection_sweep_lines()) std::printf("%s\n", line.c_str());
  return 0;
}
