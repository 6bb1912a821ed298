/* redis_scripts.c - the claim protocol in Lua, run inside Redis.
 *
 * Redis runs a script atomically: no other command sees the key between
 * the script's read and its write. That is what makes a claim on Redis
 * one round trip with no WATCH/MULTI retry loop, and what lets many
 * clients race for one key with exactly one NEW among them. Each script
 * mirrors protocol.c (the decision table of DESIGN.md) line for line:
 * MISMATCH before state, REPLAY for DONE, FAILED for a cached permanent
 * failure, BUSY under a live lease, otherwise NEW with token + 1 keeping
 * the longer expiry; only the current token of a PENDING, unreleased
 * record may complete, fail or extend it.
 *
 * The record is one hash, PREFIX{KEY}, with the classic idempotency-key fields status
 * (0 PENDING, 1 DONE, 2 FAILED), response and created_ts, plus token,
 * attempts, lease, expires, fp (16 raw bytes or empty), released (1,
 * only after a retryable failure), and cid/fid: the request ids of the
 * claim and of the finish that made the record what it is. Every write
 * sets PEXPIRE, so no record lives without a TTL.
 *
 * Claims and completes take up to 64 keys of one slot per call, because
 * the fixed cost of a script call on the server is larger than the work
 * for one key. A fresh key, the common case, costs EXISTS, one HSET of
 * preformatted strings and PEXPIRE, and answers with a bare integer.
 *
 * Time: ARGV[1] is the time in Unix ms, or empty for the server's TIME.
 * Using the server's clock means clients with skewed clocks agree on
 * leases; the option of passing a time exists for tests that drive time.
 * A record whose `expires` has passed is absent to every script even if
 * Redis has not removed it yet, which is what makes a passed-in clock
 * behave exactly like the server's.
 *
 * Request ids: a connection that breaks after a script ran but before
 * its reply arrived leaves the client not knowing whether it ran. The
 * client retries, and the id makes the retry answer what the first run
 * answered instead of BUSY (claim) or IDEM_ELOST (complete, fail). That
 * is what lets a claim be retried through a failover safely.
 *
 * Numbers: Lua's are doubles, exact to 2^53, far beyond any ms time or
 * token. Numbers passed to redis.call are written as integers.
 * Tokens are compared as the decimal strings they are stored as. */
#include "redis_scripts.h"

#include <openssl/sha.h>
#include <stdio.h>
#include <string.h>

#define IDEM__LUA_COMMON                                                   \
    "local function now_ms()\n"                                            \
    "  if ARGV[1] ~= '' then return tonumber(ARGV[1]) end\n"               \
    "  local t = redis.call('TIME')\n"                                     \
    "  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n" \
    "end\n"                                                                \
    "local function load(k, now)\n"                                        \
    "  local v = redis.call('HMGET', k, 'status', 'token', 'lease',\n"     \
    "    'expires', 'created_ts', 'released', 'fp', 'cid', 'fid')\n"       \
    "  if not v[1] then return nil, v end\n"                               \
    "  local r = {status = tonumber(v[1]), token = v[2] or '0',\n"         \
    "    lease = tonumber(v[3]) or 0, expires = tonumber(v[4]) or 0,\n"    \
    "    created = tonumber(v[5]) or now, released = v[6] == '1',\n"       \
    "    fp = v[7] or '', cid = v[8] or '', fid = v[9] or ''}\n"           \
    "  if now >= r.expires then return nil, v end\n"                       \
    "  return r, v\n"                                                      \
    "end\n"                                                                \
    "local function why_not(r, token)\n"                                   \
    "  if not r then return 1 end\n"                                       \
    "  if r.status ~= 0 then return 2 end\n"                               \
    "  if r.released then return 3 end\n"                                  \
    "  if r.token ~= token then return 4 end\n"                            \
    "  return 0\n"                                                         \
    "end\n"

/* Claims and completes take many keys (of one slot) per call and answer
 * with one array entry per key. A key that is not a hash stops the script
 * with WRONGTYPE; the client then sends the keys one by one. */

/* KEYS: the keys; ARGV: now, lease_ms, ttl_ms, then fp and request id of
 * each key. -> per key, {kind, token, lease_until[, data]} with kind as
 * idem_outcome_kind, or for a fresh key just lease_until (NEW, token 1).
 * The record of an expired key is replaced whole (DEL, then HSET). */
static const char idem__lua_claim[] =
    IDEM__LUA_COMMON
    "local now_s, lease_s, exp_s, lease_n\n"
    "local function claim(k, fp, rid, now, lease_ms, ttl_ms)\n"
    "  if redis.call('EXISTS', k) == 0 then\n"
    /* The common case, a fresh key: every value is a string made once
     * per call (formatting numbers costs more than the HSET itself), and
     * the answer is the lease alone, meaning NEW with token 1. */
    "    redis.call('HSET', k, 'status', '0', 'token', '1', 'attempts', '1',\n"
    "      'lease', lease_s, 'expires', exp_s, 'created_ts', now_s, 'fp', fp,\n"
    "      'cid', rid)\n"
    "    redis.call('PEXPIRE', k, ttl_ms)\n"
    "    return lease_n\n"
    "  end\n"
    "  local r, v = load(k, now)\n"
    "  if r and fp ~= '' and r.fp ~= '' and r.fp ~= fp then\n"
    "    return {5, tonumber(r.token), 0}\n"
    "  end\n"
    "  if r and r.status == 1 then\n"
    "    return {2, tonumber(r.token), 0, redis.call('HGET', k, 'response') or ''}\n"
    "  end\n"
    "  if r and r.status == 2 then\n"
    "    return {3, tonumber(r.token), 0, redis.call('HGET', k, 'response') or ''}\n"
    "  end\n"
    "  if r and not r.released and now < r.lease then\n"
    "    if r.cid == rid then return {1, tonumber(r.token), r.lease} end\n"
    "    return {4, tonumber(r.token), r.lease}\n"
    "  end\n"
    "  local lease = now + lease_ms\n"
    "  local token, created, exp = 1, now, now + ttl_ms\n"
    "  if r then\n"
    "    token = tonumber(r.token) + 1\n"
    "    created = r.created\n"
    "    if r.expires > exp then exp = r.expires end\n"
    "    if fp == '' then fp = r.fp end\n"
    "  end\n"
    "  redis.call('DEL', k)\n"
    "  redis.call('HSET', k, 'status', 0, 'token', token, 'attempts', token,\n"
    "    'lease', lease, 'expires', exp, 'created_ts', created, 'fp', fp,\n"
    "    'cid', rid)\n"
    "  redis.call('PEXPIRE', k, exp - now)\n"
    "  return {1, token, lease}\n"
    "end\n"
    "local now = now_ms()\n"
    "local lease_ms, ttl_ms = tonumber(ARGV[2]), tonumber(ARGV[3])\n"
    /* A record lives at least as long as its lease (as in protocol.c). */
    "if ttl_ms < lease_ms then ttl_ms = lease_ms end\n"
    "now_s = string.format('%.0f', now)\n"
    "lease_n = now + lease_ms\n"
    "lease_s = string.format('%.0f', lease_n)\n"
    "exp_s = string.format('%.0f', now + ttl_ms)\n"
    "local out = {}\n"
    "for i, k in ipairs(KEYS) do\n"
    "  out[i] = claim(k, ARGV[2 + 2 * i], ARGV[3 + 2 * i], now, lease_ms,\n"
    "    ttl_ms)\n"
    "end\n"
    "return out\n";

/* KEYS: the keys; ARGV: now, then token, response, ttl_ms and request id
 * of each key. -> one 0-or-why per key. */
static const char idem__lua_complete[] =
    IDEM__LUA_COMMON
    "local function complete(k, tok, resp, ttl, rid, now)\n"
    "  local r, v = load(k, now)\n"
    "  if r and r.status == 1 and r.token == tok and r.fid == rid then\n"
    "    return 0\n"
    "  end\n"
    "  local w = why_not(r, tok)\n"
    "  if w ~= 0 then return w end\n"
    "  redis.call('HSET', k, 'status', 1, 'response', resp, 'lease', 0,\n"
    "    'expires', now + ttl, 'fid', rid)\n"
    "  redis.call('PEXPIRE', k, ttl)\n"
    "  return 0\n"
    "end\n"
    "local now = now_ms()\n"
    "local out = {}\n"
    "for i, k in ipairs(KEYS) do\n"
    "  local a = 4 * i - 2\n"
    "  out[i] = complete(k, ARGV[a], ARGV[a + 1], tonumber(ARGV[a + 2]),\n"
    "    ARGV[a + 3], now)\n"
    "end\n"
    "return out\n";

/* KEYS[1]; ARGV: now, token, error, retryable (0/1), failure_ttl_ms,
 * request id. -> 0 or why. */
static const char idem__lua_fail[] =
    IDEM__LUA_COMMON
    "local now = now_ms()\n"
    "local k, tok = KEYS[1], ARGV[2]\n"
    "local r = load(k, now)\n"
    "if r and r.token == tok and r.fid == ARGV[6] and\n"
    "   (r.status == 2 or r.released) then\n"
    "  return 0\n"
    "end\n"
    "local w = why_not(r, tok)\n"
    "if w ~= 0 then return w end\n"
    "if ARGV[4] == '1' then\n"
    "  redis.call('HSET', k, 'released', 1, 'lease', 0, 'response', ARGV[3],\n"
    "    'fid', ARGV[6])\n"
    "else\n"
    "  local ttl = tonumber(ARGV[5])\n"
    "  redis.call('HSET', k, 'status', 2, 'lease', 0, 'response', ARGV[3],\n"
    "    'expires', now + ttl, 'fid', ARGV[6])\n"
    "  redis.call('PEXPIRE', k, ttl)\n"
    "end\n"
    "return 0\n";

/* KEYS[1]; ARGV: now, token, lease_ms. -> 0 or why. */
static const char idem__lua_extend[] =
    IDEM__LUA_COMMON
    "local now = now_ms()\n"
    "local k = KEYS[1]\n"
    "local r = load(k, now)\n"
    "local w = why_not(r, ARGV[2])\n"
    "if w ~= 0 then return w end\n"
    "local lease = now + tonumber(ARGV[3])\n"
    "local exp = r.expires\n"
    "if exp < lease then exp = lease end\n"
    "redis.call('HSET', k, 'lease', lease, 'expires', exp)\n"
    "redis.call('PEXPIRE', k, exp - now)\n"
    "return 0\n";

/* KEYS[1]; ARGV: now. -> nil, or {status, token, released, created,
 * expires, lease, fp, response or nil}. Reads only. */
static const char idem__lua_get[] =
    IDEM__LUA_COMMON
    "local now = now_ms()\n"
    "local r = load(KEYS[1], now)\n"
    "if not r then return false end\n"
    "local resp = redis.call('HGET', KEYS[1], 'response')\n"
    "return {r.status, tonumber(r.token), r.released and 1 or 0, r.created,\n"
    "  r.expires, r.lease, r.fp, resp}\n";

/* KEYS[1]; ARGV: now. -> 1 if a live record was deleted, else 0. */
static const char idem__lua_forget[] =
    IDEM__LUA_COMMON
    "local now = now_ms()\n"
    "local r = load(KEYS[1], now)\n"
    "redis.call('DEL', KEYS[1])\n"
    "if r then return 1 end\n"
    "return 0\n";

/* KEYS: names found by SCAN, all in one slot; ARGV: now, retention_ms.
 * Deletes the records that are past their expiry, and those that have no
 * TTL (written by hand or by an older tool) and were created longer than
 * the retention ago. Keys that are not idem records are left alone.
 * -> how many were deleted. */
static const char idem__lua_sweep[] =
    IDEM__LUA_COMMON
    "local now = now_ms()\n"
    "local cutoff = now - tonumber(ARGV[2])\n"
    "local n = 0\n"
    "for _, k in ipairs(KEYS) do\n"
    "  if redis.call('TYPE', k).ok == 'hash' then\n"
    "    local v = redis.call('HMGET', k, 'created_ts', 'expires')\n"
    "    local created, exp = tonumber(v[1]), tonumber(v[2])\n"
    "    if created then\n"
    "      local gone = exp ~= nil and now >= exp\n"
    "      if not gone and created < cutoff and\n"
    "         redis.call('PTTL', k) == -1 then\n"
    "        gone = true\n"
    "      end\n"
    "      if gone then redis.call('DEL', k); n = n + 1 end\n"
    "    end\n"
    "  end\n"
    "end\n"
    "return n\n";

/* KEYS: names found by SCAN, all in one slot; ARGV: now.
 * -> {pending, done, failed} among the live records. */
static const char idem__lua_stats[] =
    IDEM__LUA_COMMON
    "local now = now_ms()\n"
    "local c = {0, 0, 0}\n"
    "for _, k in ipairs(KEYS) do\n"
    "  if redis.call('TYPE', k).ok == 'hash' then\n"
    "    local r = load(k, now)\n"
    "    if r and r.status and r.status >= 0 and r.status <= 2 then\n"
    "      c[r.status + 1] = c[r.status + 1] + 1\n"
    "    end\n"
    "  end\n"
    "end\n"
    "return c\n";

static const char *const idem__scripts[IDEM__S_COUNT] = {
    idem__lua_claim,  idem__lua_complete, idem__lua_fail,
    idem__lua_extend, idem__lua_get,      idem__lua_forget,
    idem__lua_sweep,  idem__lua_stats,
};

const char *idem__script_text(enum idem__script i)
{
    return idem__scripts[i];
}

void idem__script_shas(char out[IDEM__S_COUNT][41])
{
    for (int i = 0; i < IDEM__S_COUNT; i++) {
        unsigned char md[SHA_DIGEST_LENGTH];
        SHA1((const unsigned char *)idem__scripts[i],
             strlen(idem__scripts[i]), md);
        for (int j = 0; j < SHA_DIGEST_LENGTH; j++)
            snprintf(&out[i][2 * j], 3, "%02x", md[j]);
    }
}
