/* placeholder: being written */
#include "kvattn.h"
#include "harness.h"
void test_tree(void);
void test_tree(void) {}
