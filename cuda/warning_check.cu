// nvcc compiles the g++ warning check too (tests/warning_check.cpp says what it checks).
#include "../tests/warning_check.cpp"
