/* tests/consumer/main.c - a program using kvattn as a user would: through
   <kvattn.h> from an install (CMake package or pkg-config) or from the
   kvattn::kvattn target of add_subdirectory.  Exit status 0 = every check passed. */
#include "check.h"

int main(void) { return consumer_check("C"); }
