/* count_alloc.h - counts the library's KVATTN_MALLOC / KVATTN_FREE calls in
 * one test file (kt_mallocs, kt_frees; every file has its own copy of the
 * library and of the counts).  Include before kvattn.h. */
#ifndef KVATTN_TEST_COUNT_ALLOC_H
#define KVATTN_TEST_COUNT_ALLOC_H

#include <stdlib.h>

static long kt_mallocs, kt_frees;
static void *kt_counting_malloc(size_t n) {
  kt_mallocs++;
  return malloc(n);
}
static void kt_counting_free(void *p) {
  if (p) kt_frees++;
  free(p);
}
#define KVATTN_MALLOC(n) kt_counting_malloc(n)
#define KVATTN_FREE(p) kt_counting_free(p)

#endif /* KVATTN_TEST_COUNT_ALLOC_H */
