/* tier_dir.h - a prefix tier in a directory of files, for kva_cache_desc.spill
   and fetch (docs/API.md, "Prefix tier"): one file per block record, named by
   its key in hex. A record is written to a temporary name and renamed, so a
   crash never leaves half a record under a real name, and processes sharing
   the directory (on one machine, or over a network file system) see whole
   records or none; two writers of one key write the same record.

       tier_dir d;
       if (!tier_dir_open(&d, "/var/cache/kvattn")) ...;
       desc.spill = tier_dir_spill; desc.fetch = tier_dir_fetch; desc.tier_user = &d;
       ... kva_cache_create(&desc, &c) ...
       tier_dir_load(&d, c, &refused);   // optional: every record now, not at its first lookup

   POSIX (mkdir, getpid); C stdio for the files. */
#ifndef KVATTN_TIER_DIR_H
#define KVATTN_TIER_DIR_H

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include "kvattn.h"

typedef struct {
  char dir[1024];
  unsigned long temp_counter; /* temporary names: pid and a counter, unique per process */
  long writes, write_errors, reads, read_misses;
} tier_dir;

/* Use (and create, one level) the directory; 0 if it cannot be used. */
static inline int tier_dir_open(tier_dir *d, const char *dir) {
  struct stat sb;
  memset(d, 0, sizeof *d);
  if (strlen(dir) + 80 >= sizeof d->dir) return 0;
  strcpy(d->dir, dir);
  if (mkdir(dir, 0777) != 0 && errno != EEXIST) return 0;
  return stat(dir, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static inline void tier_dir__path(const tier_dir *d, const uint8_t key[32], char *path, size_t cap) {
  char hex[65];
  int i;
  for (i = 0; i < 32; i++) snprintf(hex + 2 * i, 3, "%02x", key[i]);
  snprintf(path, cap, "%s/%s.kvpb", d->dir, hex);
}

static kva_status tier_dir_spill(void *user, const uint8_t key[32], const void *rec, size_t size) {
  tier_dir *d = (tier_dir *)user;
  char path[1200], temp[1300];
  FILE *f;
  int ok;
  tier_dir__path(d, key, path, sizeof path);
  snprintf(temp, sizeof temp, "%s.tmp.%ld.%lu", path, (long)getpid(), d->temp_counter++);
  d->writes++;
  f = fopen(temp, "wb");
  if (!f) {
    d->write_errors++;
    return KVA_ERR_FULL;
  }
  ok = fwrite(rec, 1, size, f) == size;
  ok = fclose(f) == 0 && ok;
  if (!ok || rename(temp, path) != 0) { /* the real name only ever names a whole record */
    remove(temp);
    d->write_errors++;
    return KVA_ERR_FULL;
  }
  return KVA_OK;
}

static kva_status tier_dir_fetch(void *user, const uint8_t key[32], void *rec, size_t cap, size_t *size) {
  tier_dir *d = (tier_dir *)user;
  char path[1200];
  FILE *f;
  size_t n;
  tier_dir__path(d, key, path, sizeof path);
  d->reads++;
  f = fopen(path, "rb");
  if (!f) {
    d->read_misses++;
    return KVA_ERR_ARG; /* not there: a miss */
  }
  n = fread(rec, 1, cap, f);
  if (n == cap && fgetc(f) != EOF) n = cap + 1; /* longer than any record of this cache: the cache refuses it */
  fclose(f);
  *size = n;
  return KVA_OK;
}

/* Take the directory's records into the cache now (kva_prefix_load), so
   that a restarted server's first requests find their prefixes in memory.
   Directory order is arbitrary: a record whose parent is not in memory yet
   waits for the next pass; passes stop when one takes nothing in, or when
   the pool has no free block (the rest stay for fetch). *refused counts
   files that are not whole records of this cache. Returns the records
   loaded, or -1 if the directory cannot be read. */
static inline int tier_dir_load(tier_dir *d, kva_cache *c, int *refused) {
  size_t size = kva_prefix_record_size(c), n_names = 0, cap_names = 0, i;
  char **names = NULL, path[1400];
  unsigned char *rec = (unsigned char *)malloc(size + 1);
  DIR *dir = opendir(d->dir);
  struct dirent *e;
  int loaded = 0, progress = 1, full = 0;
  *refused = 0;
  if (!dir || !rec || size == 0) {
    if (dir) closedir(dir);
    free(rec);
    return -1;
  }
  while ((e = readdir(dir)) != NULL) { /* whole records only: temporary names end in .tmp.PID.N */
    size_t len = strlen(e->d_name);
    char **grown;
    if (len < 5 || strcmp(e->d_name + len - 5, ".kvpb") != 0) continue;
    if (n_names == cap_names) {
      cap_names = cap_names ? 2 * cap_names : 64;
      grown = (char **)realloc(names, cap_names * sizeof *names);
      if (!grown) break;
      names = grown;
    }
    if ((names[n_names] = (char *)malloc(len + 1)) == NULL) break;
    strcpy(names[n_names++], e->d_name);
  }
  closedir(dir);
  while (progress && !full) {
    progress = 0;
    for (i = 0; i < n_names && !full; i++) {
      FILE *f;
      size_t n;
      int outcome;
      kva_status st;
      if (!names[i]) continue; /* taken in or refused on an earlier pass */
      snprintf(path, sizeof path, "%s/%s", d->dir, names[i]);
      f = fopen(path, "rb");
      n = f ? fread(rec, 1, size + 1, f) : 0; /* one byte more: a longer file is refused */
      if (f) fclose(f);
      d->reads++;
      st = kva_prefix_load(c, rec, n, &outcome);
      if (st == KVA_ERR_FULL) full = 1;
      if (st == KVA_ERR_FULL || (st == KVA_OK && outcome == KVA_PREFIX_NO_PARENT)) continue;
      if (st != KVA_OK) ++*refused;
      else loaded += outcome == KVA_PREFIX_LOADED;
      free(names[i]);
      names[i] = NULL;
      progress = 1;
    }
  }
  for (i = 0; i < n_names; i++) free(names[i]);
  free(names);
  free(rec);
  return loaded;
}

/* Remove the records (*.kvpb) in dir, then dir itself if that leaves it empty: a scratch tier's cleanup */
static inline void tier_dir_remove(const char *dir) {
  DIR *d = opendir(dir);
  struct dirent *e;
  char path[1400];
  while (d && (e = readdir(d)) != NULL)
    if (strstr(e->d_name, ".kvpb")) {
      snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
      remove(path);
    }
  if (d) closedir(d);
  rmdir(dir);
}

#endif /* KVATTN_TIER_DIR_H */
