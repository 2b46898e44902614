/* support - helpers shared by the unit tests: thread-rank jobs on the in-process transport. */
#ifndef CFX_TEST_SUPPORT_H
#define CFX_TEST_SUPPORT_H
#endif
