// The compiled core of ringzero's separate-compilation mode (docs/compile_time.md): compile this
// file once with -DRINGZERO_SEPARATE_COMPILATION, as every file of the program that includes
// ringzero, and link it in (Meson: the `ringzero-separate` dependency does both).
#include "ringzero/impl/src.hpp"
