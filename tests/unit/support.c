/* support - helpers shared by the unit tests (see support.h). */
#include "support.h"
