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
#include "tier_load.h"

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

typedef struct {
  tier_dir *d;
  char **names;
} tier_dir__list;
static int tier_dir__read(void *user, size_t i, unsigned char *buf, size_t cap, size_t *size) {
  tier_dir__list *l = (tier_dir__list *)user;
  char path[1400];
  FILE *f;
  snprintf(path, sizeof path, "%s/%s", l->d->dir, l->names[i]);
  l->d->reads++;
  if (!(f = fopen(path, "rb"))) return 0; /* removed since it was listed */
  *size = fread(buf, 1, cap, f);
  fclose(f);
  return 1;
}

/* Take the directory's records into the cache now (tier_load_passes), so
   that a restarted server's first requests find their prefixes in memory.
   Only whole records: temporary names end in .tmp.PID.N. *refused counts
   files that are not records of this cache. Returns the records loaded, or
   -1 if the directory cannot be read. */
static inline int tier_dir_load(tier_dir *d, kva_cache *c, int *refused) {
  size_t n_names = 0, cap_names = 0, i;
  char **names = NULL;
  DIR *dir = opendir(d->dir);
  struct dirent *e;
  tier_dir__list list;
  int loaded;
  *refused = 0;
  if (!dir) return -1;
  while ((e = readdir(dir)) != NULL) {
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
  list.d = d, list.names = names;
  loaded = tier_load_passes(c, n_names, tier_dir__read, &list, refused);
  for (i = 0; i < n_names; i++) free(names[i]);
  free(names);
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
