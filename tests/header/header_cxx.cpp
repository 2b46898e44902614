/* The public header alone, compiled as C++17 (-std=c++17 -pedantic -Werror): extern "C", no
 * C-only constructs. */
#include <conflux/conflux.h>

#define CFX_HEADER_TEST_LANG "C++17"
#include "header_test.inc"
