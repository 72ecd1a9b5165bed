/* placeholder: being written */
#include "kvattn.h"
#include "harness.h"
void test_seqio(void);
void test_seqio(void) {}
