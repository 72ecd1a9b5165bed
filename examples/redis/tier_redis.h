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
       ...
       tier_redis_close(&r);

   Needs hiredis (Debian: libhiredis-dev; link -lhiredis). */
#ifndef KVATTN_TIER_REDIS_H
#define KVATTN_TIER_REDIS_H

#include <stdio.h>
#include <string.h>
#include <sys/time.h>

#include <hiredis/hiredis.h>

#include "kvattn.h"

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

#endif /* KVATTN_TIER_REDIS_H */
