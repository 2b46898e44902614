/* The public header alone, compiled as strict ISO C99 (-std=c99 -pedantic -Werror). */
#include <conflux/conflux.h>

#define CFX_HEADER_TEST_LANG "C99"
#include "header_test.inc"
