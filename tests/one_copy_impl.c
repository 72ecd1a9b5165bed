/* The one compiled copy of kvattn in a program whose other files include
   the header with KVATTN_DECLARATIONS_ONLY (`make test-all`, step one-copy,
   linked with two_tu_a.c and two_tu_b.c built that way). */
#define KVATTN_IMPLEMENTATION
#include "kvattn.h"
