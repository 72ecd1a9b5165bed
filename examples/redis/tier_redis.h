/* tier_redis.h - a prefix tier in Redis (or Valkey, which speaks the same
   protocol), for kva_cache_desc.spill and fetch (docs/API.md, "Prefix
   tier"): every kvattn process pointed at one server shares its published
   prefix blocks, on one machine or many. A record is one string value under
   "kvattn:pb:" and its key in hex; SET replaces a value whole, so a reader
   sees a whole record or none, and two writers of one key write the same
   record. A server that is down, slow (past the timeout) or answers
   anything but a string is a miss: the lookup goes on without it.

       tier_redis r;
       if (!tier_redis_open(&r, "127.0.0.1", 6379, 200)) ...;  // 200 ms per command at most
       desc.spill = tier_redis_spill; desc.fetch = tier_redis_fetch; desc.tier_user = &r;
       ... kva_cache_create(&desc, &c) ...
       tier_redis_load(&r, c, &refused);   // optional: every record now, not at its first lookup
       ...
       tier_redis_close(&r);

   Needs hiredis (Debian: libhiredis-dev; link -lhiredis). */
#ifndef KVATTN_TIER_REDIS_H
#define KVATTN_TIER_REDIS_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#include <hiredis/hiredis.h>

#include "kvattn.h"
#include "../tier_load.h"

typedef struct {
  redisContext *rc;
  long sets, set_errors, gets, get_misses;
} tier_redis;

/* Connect (timeout_ms for the connection and for every command); 0 if the server cannot be reached. */
static inline int tier_redis_open(tier_redis *r, const char *host, int port, int timeout_ms) {
  struct timeval tv;
  memset(r, 0, sizeof *r);
  tv.tv_sec = timeout_ms / 1000;
  tv.tv_usec = (timeout_ms % 1000) * 1000;
  r->rc = redisConnectWithTimeout(host, port, tv);
  if (!r->rc || r->rc->err || redisSetTimeout(r->rc, tv) != REDIS_OK) {
    if (r->rc) redisFree(r->rc);
    r->rc = NULL;
    return 0;
  }
  return 1;
}

static inline void tier_redis_close(tier_redis *r) {
  if (r->rc) redisFree(r->rc);
  r->rc = NULL;
}

static inline void tier_redis__name(const uint8_t key[32], char name[80]) {
  int i;
  memcpy(name, "kvattn:pb:", 10);
  for (i = 0; i < 32; i++) snprintf(name + 10 + 2 * i, 3, "%02x", key[i]);
}

static kva_status tier_redis_spill(void *user, const uint8_t key[32], const void *rec, size_t size) {
  tier_redis *r = (tier_redis *)user;
  char name[80];
  redisReply *reply;
  int ok;
  r->sets++;
  if (!r->rc || r->rc->err) {
    r->set_errors++;
    return KVA_ERR_FULL;
  }
  tier_redis__name(key, name);
  reply = (redisReply *)redisCommand(r->rc, "SET %s %b", name, rec, size);
  ok = reply && reply->type == REDIS_REPLY_STATUS;
  if (reply) freeReplyObject(reply);
  if (!ok) r->set_errors++;
  return ok ? KVA_OK : KVA_ERR_FULL;
}

static kva_status tier_redis_fetch(void *user, const uint8_t key[32], void *rec, size_t cap, size_t *size) {
  tier_redis *r = (tier_redis *)user;
  char name[80];
  redisReply *reply;
  kva_status st = KVA_ERR_ARG;
  r->gets++;
  if (!r->rc || r->rc->err) { /* a broken connection stays broken: every lookup a miss, at once */
    r->get_misses++;
    return KVA_ERR_ARG;
  }
  tier_redis__name(key, name);
  reply = (redisReply *)redisCommand(r->rc, "GET %s", name);
  if (reply && reply->type == REDIS_REPLY_STRING) {
    size_t n = reply->len;
    memcpy(rec, reply->str, n < cap ? n : cap);
    *size = n; /* more than cap: the cache refuses it */
    st = KVA_OK;
  } else {
    r->get_misses++;
  }
  if (reply) freeReplyObject(reply);
  return st;
}

typedef struct {
  tier_redis *r;
  char **names;
} tier_redis__list;
static int tier_redis__read(void *user, size_t i, unsigned char *buf, size_t cap, size_t *size) {
  tier_redis__list *l = (tier_redis__list *)user;
  redisReply *reply = (redisReply *)redisCommand(l->r->rc, "GET %s", l->names[i]);
  int got;
  l->r->gets++;
  if (!reply) return -1; /* the connection broke: what is loaded stays */
  got = reply->type == REDIS_REPLY_STRING;
  if (got) { /* (a longer value arrives cut to cap: refused) */
    *size = reply->len < cap ? reply->len : cap;
    memcpy(buf, reply->str, *size);
  }
  freeReplyObject(reply);
  return got; /* anything but a string: gone since SCAN */
}

/* Take every record the server holds into the cache now (tier_load_passes):
   the names from SCAN, which never blocks the server as KEYS would, then
   GETs. *refused counts values that are not records of this cache. Returns
   the records loaded, or -1 if the server cannot be listed. */
static inline int tier_redis_load(tier_redis *r, kva_cache *c, int *refused) {
  size_t n_names = 0, cap_names = 0, i;
  char **names = NULL, cursor[32] = "0";
  int loaded = -1, listed = 1;
  tier_redis__list list;
  *refused = 0;
  if (!r->rc || r->rc->err) return -1;
  do { /* SCAN cursor MATCH kvattn:pb:* : [next cursor, [names]] */
    redisReply *reply = (redisReply *)redisCommand(r->rc, "SCAN %s MATCH kvattn:pb:* COUNT 512", cursor);
    if (!reply || reply->type != REDIS_REPLY_ARRAY || reply->elements != 2 ||
        reply->element[0]->type != REDIS_REPLY_STRING || reply->element[0]->len >= sizeof cursor ||
        reply->element[1]->type != REDIS_REPLY_ARRAY) {
      if (reply) freeReplyObject(reply);
      listed = 0;
      break;
    }
    memcpy(cursor, reply->element[0]->str, reply->element[0]->len);
    cursor[reply->element[0]->len] = '\0';
    for (i = 0; i < reply->element[1]->elements; i++) {
      const redisReply *name = reply->element[1]->element[i];
      char **grown;
      if (name->type != REDIS_REPLY_STRING) continue;
      if (n_names == cap_names) {
        cap_names = cap_names ? 2 * cap_names : 64;
        grown = (char **)realloc(names, cap_names * sizeof *names);
        if (!grown) break;
        names = grown;
      }
      if ((names[n_names] = (char *)malloc(name->len + 1)) == NULL) break;
      memcpy(names[n_names], name->str, name->len);
      names[n_names++][name->len] = '\0';
    }
    freeReplyObject(reply);
  } while (strcmp(cursor, "0") != 0);
  list.r = r, list.names = names;
  if (listed) loaded = tier_load_passes(c, n_names, tier_redis__read, &list, refused);
  for (i = 0; i < n_names; i++) free(names[i]);
  free(names);
  return loaded;
}

#endif /* KVATTN_TIER_REDIS_H */
