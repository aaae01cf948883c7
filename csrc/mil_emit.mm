// placeholder: the MIL emitter lands here
#include "mil/text.h"
