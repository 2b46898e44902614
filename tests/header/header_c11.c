/* The public header alone, compiled as strict ISO C11 (-std=c11 -pedantic -Werror). */
#include <conflux/conflux.h>

#define CFX_HEADER_TEST_LANG "C11"
#include "header_test.inc"
