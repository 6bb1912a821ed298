/* redis/scripts.c - the claim protocol in Lua, run inside Redis.
 *
 * Redis runs a script atomically: no other command sees the key between
 * the script's read and its write. That is what makes a claim on Redis
 * one round trip with no WATCH/MULTI retry loop, and what lets many
 * clients race for one key with exactly one NEW among them. Each script
 * mirrors protocol.c (README, "The protocol"; protocol.h) line for line:
 * MISMATCH before state, REPLAY for DONE, FAILED for a cached permanent
 * failure, BUSY under a live lease, otherwise NEW keeping the longer
 * expiry, with attempts + 1 and a token that is the greater of the
 * record's token + 1 (expired or not: Redis may not have removed it yet)
 * and the clock in microseconds; only the current token of a PENDING,
 * unreleased record may complete, fail or extend it. A record Redis has
 * removed leaves no token behind, so the clock alone keeps the next one
 * above it (idem.h, idem_complete(), says when that is not enough).
 *
 * A record has the classic idempotency-key fields status (0 PENDING,
 * 1 DONE, 2 FAILED), response and created_ts, plus token, attempts,
 * lease, expires, fp (16 raw bytes or empty), released (1, only after a
 * retryable failure), and cid/fid: the request ids of the claim and of
 * the finish that made the record what it is. Where a record lives is
 * the layout's business, and each script is its layout's prelude
 * followed by one body, so the protocol is written once:
 *
 *   hash  one hash per key, PREFIX{KEY}, whose fields are the record's;
 *         every write sets PEXPIRE, so no record lives without a TTL.
 *   day   one hash per day and shard, PREFIX YYYY-MM-DD:{TAG}, with one
 *         field per key whose value is the record packed by MessagePack.
 *         A write moves the record into today's bucket (never back into
 *         an older one: a clock stepped back must not hide it); a bucket
 *         expires as a whole `days` days after its day ends (a TTL is
 *         only ever raised), so Redis drops a day's records with one
 *         key. A lookup reads tomorrow's bucket (for the same reason),
 *         today's and the `days` before it. The client names the
 *         buckets (KEYS must be declared for a cluster); the script
 *         picks today among them by the server's clock.
 *
 * A layout prelude defines RECS (the records' names), ARG (the
 * arguments as the bodies see them: now, then the script's own) and
 * start(), fresh(), raw(), create(), update(), response() and del().
 *
 * Claims and completes take up to 64 keys of one slot per call, because
 * the fixed cost of a script call on the server is larger than the work
 * for one key. A fresh key, the common case, costs one existence check
 * and one write of preformatted strings, and answers with a bare integer.
 *
 * Time: ARGV[1] is the time in Unix ms, or empty for the server's TIME;
 * clock() answers it in ms and in microseconds, from one reading.
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
 * Numbers: Lua's are doubles, exact to 2^53 (IDEM_TOKEN_MAX), far beyond
 * any ms time, and beyond a microsecond clock until 2255. Numbers passed
 * to redis.call are written as integers, and the day layout stores them
 * as the same decimal strings; tokens are formatted with %.0f before
 * they are stored, so that they are the decimal strings a client sends
 * whatever the server's formatting of large numbers. Tokens are compared
 * as those strings. */
#include "scripts.h"

#include <openssl/sha.h>
#include <stdio.h>
#include <string.h>

#define IDEM__LUA_CLOCK                                                    \
    "local DAY = 86400000\n"                                               \
    "local function clock()\n"                                             \
    "  local us\n"                                                         \
    "  if ARGV[1] ~= '' then\n"                                            \
    "    us = tonumber(ARGV[1]) * 1000\n"                                  \
    "  else\n"                                                             \
    "    local t = redis.call('TIME')\n"                                   \
    "    us = tonumber(t[1]) * 1000000 + tonumber(t[2])\n"                 \
    "  end\n"                                                              \
    "  return math.floor(us / 1000), us\n"                                 \
    "end\n"                                                                \
    "local function now_ms() return (clock()) end\n"

/* The hash layout: KEYS are the records; ARGV is as the bodies want it.
 * raw() answers the fields load() needs, in this order. */
#define IDEM__LUA_HASH                                                     \
    IDEM__LUA_CLOCK                                                        \
    "local RECS, ARG = KEYS, ARGV\n"                                       \
    "local function start() return clock() end\n"                          \
    "local function raw(k)\n"                                              \
    "  return redis.call('HMGET', k, 'status', 'token', 'lease',\n"        \
    "    'expires', 'created_ts', 'released', 'fp', 'cid', 'fid',\n"       \
    "    'attempts')\n"                                                    \
    "end\n"                                                                \
    "local function fresh(k) return redis.call('EXISTS', k) == 0 end\n"    \
    "local function create(k, ttl, old, ...)\n"                            \
    "  if old then redis.call('DEL', k) end\n"                             \
    "  redis.call('HSET', k, ...)\n"                                       \
    "  redis.call('PEXPIRE', k, ttl)\n"                                    \
    "end\n"                                                                \
    "local function update(k, ttl, ...)\n"                                 \
    "  redis.call('HSET', k, ...)\n"                                       \
    "  if ttl then redis.call('PEXPIRE', k, ttl) end\n"                    \
    "end\n"                                                                \
    "local function response(k)\n"                                         \
    "  return redis.call('HGET', k, 'response')\n"                         \
    "end\n"                                                                \
    "local function del(k) redis.call('DEL', k) end\n"                     \
    "local function fits(exp) return true end\n"

/* The day layout. KEYS: the buckets of one shard for consecutive days
 * from day0 (days since the epoch) on, enough to hold today and the
 * `days` before it for any server clock within a day of the client's.
 * ARGV: now, day0, days, n, the n records' names, then the bodies'
 * arguments. A record is an array in raw()'s order, then attempts and
 * response; false marks an absent field. Lookups and writes of one call
 * are remembered (seen, where, recs): a key given twice in one call sees
 * its first claim. */
#define IDEM__LUA_DAY                                                      \
    IDEM__LUA_CLOCK                                                        \
    "local F = {status = 1, token = 2, lease = 3, expires = 4,\n"          \
    "  created_ts = 5, released = 6, fp = 7, cid = 8, fid = 9,\n"          \
    "  attempts = 10, response = 11}\n"                                    \
    "local day0, ndays, nrec = tonumber(ARGV[2]), tonumber(ARGV[3]),\n"    \
    "  tonumber(ARGV[4])\n"                                                \
    "local RECS, ARG = {}, {ARGV[1]}\n"                                    \
    "for j = 1, nrec do RECS[j] = ARGV[4 + j] end\n"                       \
    "for j = 5 + nrec, #ARGV do ARG[#ARG + 1] = ARGV[j] end\n"             \
    "local today, tnow, seen, where, recs, set = 0, 0, {}, {}, {}, {}\n"   \
    "local function start()\n"                                             \
    "  local us\n"                                                         \
    "  tnow, us = clock()\n"                                                  \
    "  today = math.floor(tnow / DAY) - day0 + 1\n"                        \
    "  if today - ndays < 1 or today > #KEYS then\n"                       \
    "    error('idem: the clocks of client and server are more than a '\n" \
    "      .. 'day apart')\n"                                              \
    "  end\n"                                                              \
    "  return tnow, us\n"                                                  \
    "end\n"                                                                \
    "local function find(k)\n"                                             \
    "  if seen[k] then return recs[k] end\n"                               \
    "  seen[k] = true\n"                                                   \
    "  for i = math.min(today + 1, #KEYS), today - ndays, -1 do\n"         \
    "    local v = redis.call('HGET', KEYS[i], k)\n"                       \
    "    if v then\n"                                                      \
    "      where[k], recs[k] = i, cmsgpack.unpack(v)\n"                    \
    "      return recs[k]\n"                                               \
    "    end\n"                                                            \
    "  end\n"                                                              \
    "  return nil\n"                                                       \
    "end\n"                                                                \
    "local function raw(k) return find(k) or {false} end\n"                \
    "local function fresh(k) return find(k) == nil end\n"                  \
    "local function put(k, t, f)\n"                                        \
    "  for j = 1, #f, 2 do\n"                                              \
    "    local v = f[j + 1]\n"                                             \
    "    if type(v) == 'number' then v = string.format('%.0f', v) end\n"   \
    "    t[F[f[j]]] = v\n"                                                 \
    "  end\n"                                                              \
    "  local w = where[k]\n"                                               \
    "  local d = w and w > today and w or today\n"                         \
    "  local b = KEYS[d]\n"                                                \
    "  if w and w ~= d then redis.call('HDEL', KEYS[w], k) end\n"          \
    "  redis.call('HSET', b, k, cmsgpack.pack(t))\n"                       \
    "  if not set[d] then\n"                                               \
    "    local ttl = (day0 + d + ndays) * DAY - tnow\n"                     \
    "    if redis.call('PTTL', b) < ttl then\n"                            \
    "      redis.call('PEXPIRE', b, ttl)\n"                                \
    "    end\n"                                                            \
    "    set[d] = true\n"                                                  \
    "  end\n"                                                              \
    "  where[k], recs[k] = d, t\n"                                         \
    "end\n"                                                                \
    "local function fits(exp)\n"                                           \
    "  return exp <= (day0 + today + ndays) * DAY\n"                       \
    "end\n"                                                                \
    "local function create(k, ttl, old, ...)\n"                            \
    "  put(k, {false, false, false, false, false, false, false, false,\n"  \
    "    false, false, false}, {...})\n"                                   \
    "end\n"                                                                \
    "local function update(k, ttl, ...) put(k, recs[k], {...}) end\n"      \
    "local function response(k) return recs[k][11] end\n"                  \
    "local function del(k)\n"                                              \
    "  if where[k] then redis.call('HDEL', KEYS[where[k]], k) end\n"       \
    "  where[k], recs[k] = nil, nil\n"                                     \
    "end\n"

/* What every body shares, after its layout's prelude. load() answers a
 * live record, or nil and, for an expired one Redis still keeps, its
 * token (the next must be greater). */
#define IDEM__LUA_COMMON                                                   \
    "local function load(k, now)\n"                                        \
    "  local v = raw(k)\n"                                                 \
    "  if not v[1] then return nil end\n"                                  \
    "  local r = {status = tonumber(v[1]), token = v[2] or '0',\n"         \
    "    lease = tonumber(v[3]) or 0, expires = tonumber(v[4]) or 0,\n"    \
    "    created = tonumber(v[5]) or now, released = v[6] == '1',\n"       \
    "    fp = v[7] or '', cid = v[8] or '', fid = v[9] or '',\n"           \
    "    attempts = tonumber(v[10]) or 1}\n"                               \
    "  if now >= r.expires then return nil, r.token end\n"                 \
    "  return r\n"                                                         \
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

/* How a claim that answers NEW writes its record. The claim script
 * writes it PENDING; the claim-done script (IDEM_CLAIM_DONE) writes it
 * PENDING and then, in the same script, DONE with an empty response
 * living the claim's ttl (ARG[3]) from now, as local: does. So a batch is
 * one round trip with per-key outcomes that are what the store holds, and
 * a key given twice sees the first one's DONE (REPLAY). A DONE record
 * keeps the lease it was granted and the claim's request id, so that a
 * retried claim-done answers NEW with the same token and lease. */
#define IDEM__LUA_GRANT(done)                                              \
    "local DONE = " done "\n"                                              \
    "local function grant(k, now, ttl, old, ...)\n"                        \
    "  create(k, ttl, old, ...)\n"                                         \
    "  if DONE then\n"                                                     \
    "    local t = tonumber(ARG[3])\n"                                     \
    "    update(k, t, 'status', 1, 'response', '', 'expires', now + t)\n"  \
    "  end\n"                                                              \
    "end\n"

/* RECS: the keys; ARG: now, lease_ms, ttl_ms, then fp and request id of
 * each key. -> per key, {kind, token, lease_until, attempts[, data]}
 * with kind as idem_outcome_kind (data: REPLAY's and FAILED's response;
 * a NEW's is 1 for a takeover), or for a fresh key just the token: NEW
 * with attempts 1, the token the call's clock in microseconds, so that
 * lease_until is token / 1000 + lease_ms. The record of an expired key
 * is replaced whole. */
#define IDEM__LUA_CLAIM                                                    \
    "local now_s, lease_s, exp_s, tok_n, tok_s\n"                          \
    "local function claim(k, fp, rid, now, lease_ms, ttl_ms)\n"            \
    "  if fresh(k) then\n"                                                 \
    /* The common case, a fresh key: every value is a string made once    \
     * per call (formatting numbers costs more than the write itself),    \
     * and the answer is the token alone. */                              \
    "    grant(k, now, ttl_ms, false, 'status', '0', 'token', tok_s,\n"    \
    "      'attempts', '1', 'lease', lease_s, 'expires', exp_s,\n"         \
    "      'created_ts', now_s, 'fp', fp, 'cid', rid)\n"                   \
    "    return tok_n\n"                                                   \
    "  end\n"                                                              \
    "  local r, gone = load(k, now)\n"                                     \
    "  if r and fp ~= '' and r.fp ~= '' and r.fp ~= fp then\n"             \
    "    return {5, tonumber(r.token), 0, r.attempts}\n"                   \
    "  end\n"                                                              \
    "  if DONE and r and r.status == 1 and r.cid == rid then\n"           \
    "    return {1, tonumber(r.token), r.lease, r.attempts}\n"           \
    "  end\n"                                                              \
    "  if r and r.status == 1 then\n"                                      \
    "    return {2, tonumber(r.token), 0, r.attempts, response(k) or ''}\n" \
    "  end\n"                                                              \
    "  if r and r.status == 2 then\n"                                      \
    "    return {3, tonumber(r.token), 0, r.attempts, response(k) or ''}\n" \
    "  end\n"                                                              \
    "  if r and not r.released and now < r.lease then\n"                   \
    "    local kind = r.cid == rid and 1 or 4\n"                           \
    "    return {kind, tonumber(r.token), r.lease, r.attempts}\n"          \
    "  end\n"                                                              \
    "  local lease = now + lease_ms\n"                                     \
    "  local token, attempts, created, exp = tok_n, 1, now, now + ttl_ms\n" \
    "  local prev = tonumber((r and r.token) or gone or '')\n"             \
    "  if prev and prev >= token then token = prev + 1 end\n"              \
    "  if r then\n"                                                        \
    "    attempts = r.attempts + 1\n"                                      \
    "    created = r.created\n"                                            \
    "    if r.expires > exp then exp = r.expires end\n"                    \
    "    if fp == '' then fp = r.fp end\n"                                 \
    "  end\n"                                                              \
    "  grant(k, now, exp - now, true, 'status', 0,\n"                     \
    "    'token', string.format('%.0f', token), 'attempts', attempts,\n"   \
    "    'lease', lease, 'expires', exp, 'created_ts', created, 'fp', fp,\n" \
    "    'cid', rid)\n"                                                    \
    /* A 5th entry says a takeover: the holder's lease ran out before   \
     * it finished or gave the key up (metrics count it). */             \
    "  if r and r.status == 0 and not r.released then\n"                  \
    "    return {1, token, lease, attempts, 1}\n"                          \
    "  end\n"                                                              \
    "  return {1, token, lease, attempts}\n"                               \
    "end\n"                                                                \
    "local now, now_us = start()\n"                                        \
    "local lease_ms, ttl_ms = tonumber(ARG[2]), tonumber(ARG[3])\n"        \
    /* A record lives at least as long as its lease (as in protocol.c). */ \
    "if ttl_ms < lease_ms then ttl_ms = lease_ms end\n"                    \
    "now_s = string.format('%.0f', now)\n"                                 \
    "tok_n = now_us\n"                                                     \
    "tok_s = string.format('%.0f', now_us)\n"                              \
    "lease_s = string.format('%.0f', now + lease_ms)\n"                    \
    "exp_s = string.format('%.0f', now + ttl_ms)\n"                        \
    "local out = {}\n"                                                     \
    "for i, k in ipairs(RECS) do\n"                                        \
    "  out[i] = claim(k, ARG[2 + 2 * i], ARG[3 + 2 * i], now, lease_ms,\n" \
    "    ttl_ms)\n"                                                        \
    "end\n"                                                                \
    "return out\n"

/* RECS: the keys; ARG: now, then token, response, ttl_ms and request id
 * of each key. -> one 0-or-why per key. */
#define IDEM__LUA_COMPLETE                                                 \
    "local function complete(k, tok, resp, ttl, rid, now)\n"               \
    "  local r = load(k, now)\n"                                           \
    "  if r and r.status == 1 and r.token == tok and r.fid == rid then\n"  \
    "    return 0\n"                                                       \
    "  end\n"                                                              \
    "  local w = why_not(r, tok)\n"                                        \
    "  if w ~= 0 then return w end\n"                                      \
    "  update(k, ttl, 'status', 1, 'response', resp, 'lease', 0,\n"        \
    "    'expires', now + ttl, 'fid', rid)\n"                              \
    "  return 0\n"                                                         \
    "end\n"                                                                \
    "local now = start()\n"                                                \
    "local out = {}\n"                                                     \
    "for i, k in ipairs(RECS) do\n"                                        \
    "  local a = 4 * i - 2\n"                                              \
    "  out[i] = complete(k, ARG[a], ARG[a + 1], tonumber(ARG[a + 2]),\n"   \
    "    ARG[a + 3], now)\n"                                               \
    "end\n"                                                                \
    "return out\n"

/* RECS[1]; ARG: now, token, error, retryable (0/1), failure_ttl_ms,
 * request id. -> 0 or why. */
#define IDEM__LUA_FAIL                                                     \
    "local now = start()\n"                                                \
    "local k, tok = RECS[1], ARG[2]\n"                                     \
    "local r = load(k, now)\n"                                             \
    "if r and r.token == tok and r.fid == ARG[6] and\n"                    \
    "   (r.status == 2 or r.released) then\n"                              \
    "  return 0\n"                                                         \
    "end\n"                                                                \
    "local w = why_not(r, tok)\n"                                          \
    "if w ~= 0 then return w end\n"                                        \
    "if ARG[4] == '1' then\n"                                              \
    "  update(k, nil, 'released', 1, 'lease', 0, 'response', ARG[3],\n"    \
    "    'fid', ARG[6])\n"                                                 \
    "else\n"                                                               \
    "  local ttl = tonumber(ARG[5])\n"                                     \
    "  update(k, ttl, 'status', 2, 'lease', 0, 'response', ARG[3],\n"      \
    "    'expires', now + ttl, 'fid', ARG[6])\n"                           \
    "end\n"                                                                \
    "return 0\n"

/* RECS: the keys; ARG: now, then token and lease_ms of each key (one
 * key: now, token, lease_ms). -> one 0-or-why per key. The lease is
 * renewed to run out lease_ms from now; the record lives at least that
 * long. */
#define IDEM__LUA_EXTEND                                                   \
    "local function extend(k, tok, lease_ms, now)\n"                       \
    "  local r = load(k, now)\n"                                           \
    "  local w = why_not(r, tok)\n"                                        \
    "  if w ~= 0 then return w end\n"                                      \
    "  local lease = now + lease_ms\n"                                     \
    "  local exp = r.expires\n"                                            \
    "  if exp < lease then exp = lease end\n"                              \
    "  update(k, exp - now, 'lease', lease, 'expires', exp)\n"             \
    "  return 0\n"                                                         \
    "end\n"                                                                \
    "local now = start()\n"                                                \
    "local out = {}\n"                                                     \
    "for i, k in ipairs(RECS) do\n"                                        \
    "  out[i] = extend(k, ARG[2 * i], tonumber(ARG[2 * i + 1]), now)\n"    \
    "end\n"                                                                \
    "return out\n"

/* RECS[1]; ARG: now. -> nil, or {status, token, released, created,
 * expires, lease, attempts, fp, response or nil}. Reads only. */
#define IDEM__LUA_GET                                                      \
    "local now = start()\n"                                                \
    "local r = load(RECS[1], now)\n"                                       \
    "if not r then return false end\n"                                     \
    "return {r.status, tonumber(r.token), r.released and 1 or 0,\n"        \
    "  r.created, r.expires, r.lease, r.attempts, r.fp, response(RECS[1])}\n"

/* RECS[1]; ARG: now, status, token, released (0/1), created_ts,
 * expires, lease, fp, response, attempts. Writes the record whole,
 * replacing any (fresh() finds where the old one is). -> 1, or 0 if
 * already expired. */
#define IDEM__LUA_IMPORT                                                   \
    "local now = start()\n"                                                \
    "local k, exp = RECS[1], tonumber(ARG[6])\n"                           \
    "if exp <= now then return 0 end\n"                                    \
    "if not fits(exp) then\n"                                              \
    "  return redis.error_reply('IDEMTTL the record outlives its bucket')\n" \
    "end\n"                                                                \
    "fresh(k)\n"                                                           \
    "local f = {'status', ARG[2], 'token', ARG[3], 'attempts', ARG[10],\n" \
    "  'lease', ARG[7], 'expires', ARG[6], 'created_ts', ARG[5],\n"        \
    "  'fp', ARG[8]}\n"                                                    \
    "if ARG[4] == '1' then f[#f + 1] = 'released'; f[#f + 1] = '1' end\n"  \
    "if ARG[2] ~= '0' or ARG[9] ~= '' then\n"                              \
    "  f[#f + 1] = 'response'; f[#f + 1] = ARG[9]\n"                       \
    "end\n"                                                                \
    "create(k, exp - now, true, unpack(f))\n"                              \
    "return 1\n"

/* RECS[1]; ARG: now. -> 1 if a live record was deleted, else 0. */
#define IDEM__LUA_FORGET                                                   \
    "local now = start()\n"                                                \
    "local r = load(RECS[1], now)\n"                                       \
    "del(RECS[1])\n"                                                       \
    "if r then return 1 end\n"                                             \
    "return 0\n"

/* KEYS: names found by SCAN, all in one slot; ARGV: now, retention_ms,
 * days. Deletes the records that are past their expiry, and those that
 * have no TTL (written by hand or by an older tool) and were created
 * longer than the retention ago. Keys that are not idem records are left
 * alone. -> how many were deleted. */
#define IDEM__LUA_SWEEP_HASH                                               \
    "local now = now_ms()\n"                                               \
    "local cutoff = now - tonumber(ARGV[2])\n"                             \
    "local n = 0\n"                                                        \
    "for _, k in ipairs(KEYS) do\n"                                        \
    "  if redis.call('TYPE', k).ok == 'hash' then\n"                       \
    "    local v = redis.call('HMGET', k, 'created_ts', 'expires')\n"      \
    "    local created, exp = tonumber(v[1]), tonumber(v[2])\n"            \
    "    if created then\n"                                                \
    "      local gone = exp ~= nil and now >= exp\n"                       \
    "      if not gone and created < cutoff and\n"                         \
    "         redis.call('PTTL', k) == -1 then\n"                          \
    "        gone = true\n"                                                \
    "      end\n"                                                          \
    "      if gone then redis.call('DEL', k); n = n + 1 end\n"             \
    "    end\n"                                                            \
    "  end\n"                                                              \
    "end\n"                                                                \
    "return n\n"

/* KEYS: names found by SCAN, all in one slot; ARGV: now, cursor
 * (unused). -> {'0', {pending, done, failed}} among the live records. */
#define IDEM__LUA_STATS_HASH                                               \
    "local now = now_ms()\n"                                               \
    "local c = {0, 0, 0}\n"                                                \
    "for _, k in ipairs(KEYS) do\n"                                        \
    "  if redis.call('TYPE', k).ok == 'hash' then\n"                       \
    "    local r = load(k, now)\n"                                         \
    "    if r and r.status and r.status >= 0 and r.status <= 2 then\n"     \
    "      c[r.status + 1] = c[r.status + 1] + 1\n"                        \
    "    end\n"                                                            \
    "  end\n"                                                              \
    "end\n"                                                                \
    "return {'0', c}\n"

/* The day of a bucket from its name, ...YYYY-MM-DD:{TAG}, in days since
 * the epoch (the civil-from-days inverse of Howard Hinnant's algorithm),
 * or nil if the name is not a bucket's. */
#define IDEM__LUA_DAY_OF                                                   \
    "local function day_of(k)\n"                                           \
    "  local y, m, d = string.match(k,\n"                                  \
    "    '(%d%d%d%d)%-(%d%d)%-(%d%d):{[^}]*}$')\n"                         \
    "  if not y then return nil end\n"                                     \
    "  y, m, d = tonumber(y), tonumber(m), tonumber(d)\n"                  \
    "  if m <= 2 then y = y - 1 end\n"                                     \
    "  local era = math.floor(y / 400)\n"                                  \
    "  local yoe = y - era * 400\n"                                        \
    "  local doy = math.floor((153 * ((m + 9) % 12) + 2) / 5) + d - 1\n"   \
    "  local doe = yoe * 365 + math.floor(yoe / 4) - math.floor(yoe / 100)\n" \
    "    + doy\n"                                                          \
    "  return era * 146097 + doe - 719468\n"                               \
    "end\n"

/* KEYS: buckets found by SCAN, all in one slot; ARGV: now, retention_ms
 * (unused: a bucket's life is its days), days. Drops, whole, every
 * bucket whose days are over: those Redis has not expired yet because
 * their TTL was lost or the clock is a caller's. -> the records dropped
 * with them. */
#define IDEM__LUA_SWEEP_DAY                                                \
    IDEM__LUA_DAY_OF                                                       \
    "local now, ndays = now_ms(), tonumber(ARGV[3])\n"                     \
    "local n = 0\n"                                                        \
    "for _, k in ipairs(KEYS) do\n"                                        \
    "  local day = day_of(k)\n"                                            \
    "  if day and now >= (day + ndays + 1) * DAY and\n"                    \
    "     redis.call('TYPE', k).ok == 'hash' then\n"                       \
    "    n = n + redis.call('HLEN', k)\n"                                  \
    "    redis.call('UNLINK', k)\n"                                        \
    "  end\n"                                                              \
    "end\n"                                                                \
    "return n\n"

/* -> {cursor, {pending, done, failed}} among the live records of the
 * page. */
#define IDEM__LUA_STATS_DAY                                                \
    IDEM__LUA_BUCKET_PAGE                                                  \
    "local c = {0, 0, 0}\n"                                                \
    "local cur = page(function(k, t)\n"                                    \
    "  local st = tonumber(t[1])\n"                                        \
    "  if st >= 0 and st <= 2 then c[st + 1] = c[st + 1] + 1 end\n"        \
    "end)\n"                                                               \
    "return {cur, c}\n"

/* KEYS: names found by SCAN, all in one slot; ARGV: now, cursor
 * (unused). -> {'0', {{name, status, token, released, created, expires,
 * lease, attempts, fp, response}, ...}} for the live records among
 * them. */
#define IDEM__LUA_DUMP_HASH                                                \
    "local now = start()\n"                                                \
    "local out = {}\n"                                                     \
    "for _, k in ipairs(KEYS) do\n"                                        \
    "  if redis.call('TYPE', k).ok == 'hash' then\n"                       \
    "    local r = load(k, now)\n"                                         \
    "    if r and r.status then\n"                                         \
    "      out[#out + 1] = {k, r.status, tonumber(r.token),\n"             \
    "        r.released and 1 or 0, r.created, r.expires, r.lease,\n"      \
    "        r.attempts, r.fp, response(k) or ''}\n"                       \
    "    end\n"                                                            \
    "  end\n"                                                              \
    "end\n"                                                                \
    "return {'0', out}\n"

/* The day layout reads a bucket a page at a time (HSCAN ... COUNT 1000),
 * so that listing a day of millions of records never holds Redis up for
 * long. KEYS[1]: a bucket found by SCAN; ARGV: now, HSCAN cursor. Calls
 * each(name, record) for its live records -> the next cursor. */
#define IDEM__LUA_BUCKET_PAGE                                              \
    IDEM__LUA_DAY_OF                                                       \
    "local now = now_ms()\n"                                               \
    "local function page(each)\n"                                          \
    "  local b = KEYS[1]\n"                                                \
    "  if not day_of(b) or redis.call('TYPE', b).ok ~= 'hash' then\n"      \
    "    return '0'\n"                                                     \
    "  end\n"                                                              \
    "  local p = redis.call('HSCAN', b, ARGV[2], 'COUNT', 1000)\n"         \
    "  local kv = p[2]\n"                                                  \
    "  for i = 1, #kv, 2 do\n"                                             \
    "    local ok, t = pcall(cmsgpack.unpack, kv[i + 1])\n"                \
    "    if ok and type(t) == 'table' and tonumber(t[1]) and\n"            \
    "       tonumber(t[4]) and now < tonumber(t[4]) then\n"                \
    "      each(kv[i], t)\n"                                               \
    "    end\n"                                                            \
    "  end\n"                                                              \
    "  return p[1]\n"                                                      \
    "end\n"

/* -> {cursor, {{name, status, token, released, created, expires, lease,
 * attempts, fp, response}, ...}}, as the hash layout's. */
#define IDEM__LUA_DUMP_DAY                                                 \
    IDEM__LUA_BUCKET_PAGE                                                  \
    "local out = {}\n"                                                     \
    "local cur = page(function(k, t)\n"                                    \
    "  out[#out + 1] = {k, tonumber(t[1]), tonumber(t[2]),\n"              \
    "    t[6] == '1' and 1 or 0, tonumber(t[5]) or now, tonumber(t[4]),\n" \
    "    tonumber(t[3]) or 0, tonumber(t[10]) or 1, t[7] or '',\n"         \
    "    t[11] or ''}\n"                                                   \
    "end)\n"                                                               \
    "return {cur, out}\n"

/* idem check / repair. ARGV: now, cursor, repair (0/1). -> {cursor,
 * {readable, unreadable, first unreadable name, why}}. Unreadable means
 * what makes every claim of the key fail: not a hash, a bucket field
 * that is not a packed record, a token that is not a positive integer.
 * (A missing or odd status reads as no record, a claim replaces it.)
 * With repair those are deleted, and only those. A key gone between
 * SCAN and the script (expired, forgotten) is no damage. */
#define IDEM__LUA_CHECK_TAIL                                               \
    "local ok, bad, first, why = 0, 0, '', ''\n"                           \
    "local function count(name, w, drop)\n"                                \
    "  if not w then ok = ok + 1; return end\n"                            \
    "  bad = bad + 1\n"                                                    \
    "  if first == '' then first, why = name, w end\n"                     \
    "  if ARGV[3] == '1' then drop() end\n"                                \
    "end\n"                                                                \
    "local function flaw(st, tok)\n"                                       \
    "  if not st then return nil end\n"                                    \
    "  local t = (type(tok) == 'string' or type(tok) == 'number')\n"       \
    "    and tonumber(tok)\n"                                              \
    "  if not t or t < 1 or t % 1 ~= 0 then\n"                             \
    "    return 'token is ' .. (type(tok) == 'string' and tok or\n"          \
    "      (tok == false and 'missing' or type(tok)))\n"                   \
    "  end\n"                                                              \
    "  return nil\n"                                                       \
    "end\n"

/* KEYS: names found by SCAN, all in one slot. */
#define IDEM__LUA_CHECK_HASH                                               \
    IDEM__LUA_CHECK_TAIL                                                   \
    "for _, k in ipairs(KEYS) do\n"                                        \
    "  local t, w = redis.call('TYPE', k).ok, nil\n"                       \
    "  if t ~= 'none' then\n"                                              \
    "    if t ~= 'hash' then\n"                                            \
    "      w = 'a ' .. t .. ', not a hash'\n"                              \
    "    else\n"                                                           \
    "      local v = redis.call('HMGET', k, 'status', 'token')\n"          \
    "      w = flaw(v[1], v[2])\n"                                         \
    "    end\n"                                                            \
    "    count(k, w, function() redis.call('DEL', k) end)\n"               \
    "  end\n"                                                              \
    "end\n"                                                                \
    "return {'0', {ok, bad, first, why}}\n"

/* KEYS[1]: a bucket found by SCAN; a page of its fields per call. */
#define IDEM__LUA_CHECK_DAY                                                \
    IDEM__LUA_CHECK_TAIL                                                   \
    "local b = KEYS[1]\n"                                                  \
    "local t = redis.call('TYPE', b).ok\n"                                 \
    "if t == 'none' then return {'0', {ok, bad, first, why}} end\n"        \
    "if t ~= 'hash' then\n"                                                \
    "  count(b, 'a ' .. t .. ', not a hash',\n"                            \
    "    function() redis.call('DEL', b) end)\n"                           \
    "  return {'0', {ok, bad, first, why}}\n"                              \
    "end\n"                                                                \
    "local p = redis.call('HSCAN', b, ARGV[2], 'COUNT', 1000)\n"           \
    "local kv = p[2]\n"                                                    \
    "for i = 1, #kv, 2 do\n"                                               \
    "  local okp, r = pcall(cmsgpack.unpack, kv[i + 1])\n"                 \
    "  local w = 'not a packed record'\n"                                  \
    "  if okp and type(r) == 'table' then\n"                               \
    "    w = flaw(r[1] or nil, r[2])\n"                                    \
    "  end\n"                                                              \
    "  count(b .. ' field ' .. kv[i], w,\n"                                \
    "    function() redis.call('HDEL', b, kv[i]) end)\n"                   \
    "end\n"                                                                \
    "return {p[1], {ok, bad, first, why}}\n"

/* Checkpoints (ckpt.c): one hash per name, PREFIX checkpoint:{NAME},
 * outside the records' names and so outside every SCAN of sweep, stats,
 * dump and check, with no TTL. Fields: idem ("1": idem wrote it), blob,
 * while a sync is under way intent (the writes queued with the
 * checkpoint) and iid (the intent's id), and after one that ran the
 * caller's writes wid and wout (below). The three scripts take the key
 * as KEYS[1] and the time as ARGV[1] (unused), whatever the layout. */

/* ARGV: now, blob, intent ("" for none), iid, writes (a msgpack array
 * of commands, each an array of strings; "" for none). Replaces the
 * checkpoint, unless it holds another sync's intent not yet applied:
 * then writes nothing and answers 0 (apply that one first), else runs
 * the writes in order, then writes the key (a write that fails ends the
 * script before it), and answers 1, or {1, answer...} with writes, each
 * answer a string: a status's text (SET's OK), an integer's digits (not
 * tostring's, which prints 1e+15), empty for a nil or an array (not a
 * table's address). The writes' answers stay in the key (wout) under
 * the sync's id (wid): the same call sent again after a lost reply
 * answers them again instead of writing twice. */
#define IDEM__LUA_CKPT_PUT                                                 \
    "local k = KEYS[1]\n"                                                  \
    "local t = redis.call('TYPE', k).ok\n"                                 \
    "if ARGV[5] ~= '' and t == 'hash' and\n"                               \
    "   redis.call('HGET', k, 'wid') == ARGV[4] then\n"                    \
    "  return cmsgpack.unpack(redis.call('HGET', k, 'wout'))\n"            \
    "end\n"                                                                \
    "if t == 'hash' and redis.call('HEXISTS', k, 'intent') == 1 and\n"     \
    "   redis.call('HGET', k, 'iid') ~= ARGV[4] then\n"                    \
    "  return 0\n"                                                         \
    "end\n"                                                                \
    "local out = nil\n"                                                    \
    "if ARGV[5] ~= '' then\n"                                              \
    "  out = {1}\n"                                                        \
    "  local ws = cmsgpack.unpack(ARGV[5])\n"                              \
    "  for i = 1, #ws do\n"                                                \
    "    local a = redis.call(unpack(ws[i]))\n"                            \
    "    if type(a) == 'table' then a = a.ok or '' end\n"                  \
    "    if type(a) == 'number' then a = string.format('%.0f', a) end\n"   \
    "    out[i + 1] = a or ''\n"                                           \
    "  end\n"                                                              \
    "end\n"                                                                \
    "if t ~= 'none' then redis.call('DEL', k) end\n"                       \
    "if ARGV[3] == '' then\n"                                              \
    "  redis.call('HSET', k, 'idem', '1', 'blob', ARGV[2])\n"              \
    "else\n"                                                               \
    "  redis.call('HSET', k, 'idem', '1', 'blob', ARGV[2],\n"              \
    "    'intent', ARGV[3], 'iid', ARGV[4])\n"                             \
    "end\n"                                                                \
    "if out then\n"                                                        \
    "  redis.call('HSET', k, 'wid', ARGV[4], 'wout', cmsgpack.pack(out))\n" \
    "end\n"                                                                \
    "return out or 1\n"

/* -> false if there is none, {'bad', why} if the key is not what idem
 * writes, else {'ok', blob, intent or '', iid or ''}. Reads only. */
#define IDEM__LUA_CKPT_GET                                                 \
    "local k = KEYS[1]\n"                                                  \
    "local t = redis.call('TYPE', k).ok\n"                                 \
    "if t == 'none' then return false end\n"                               \
    "if t ~= 'hash' then return {'bad', 'a ' .. t .. ', not a hash'} end\n" \
    "local v = redis.call('HMGET', k, 'idem', 'blob', 'intent', 'iid')\n"  \
    "if v[1] ~= '1' or not v[2] or (v[3] and not v[4]) then\n"             \
    "  return {'bad', 'a hash idem did not write'}\n"                      \
    "end\n"                                                                \
    "return {'ok', v[2], v[3] or '', v[4] or ''}\n"

/* ARGV: now, iid. Drops the intent once its writes are applied, unless
 * a newer sync has replaced it meanwhile. -> 1 */
#define IDEM__LUA_CKPT_CLEAR                                               \
    "local k = KEYS[1]\n"                                                  \
    "if redis.call('TYPE', k).ok == 'hash' and\n"                          \
    "   redis.call('HGET', k, 'iid') == ARGV[2] then\n"                    \
    "  redis.call('HDEL', k, 'intent', 'iid')\n"                           \
    "end\n"                                                                \
    "return 1\n"

#define IDEM__LUA_HASH_ALL IDEM__LUA_HASH IDEM__LUA_COMMON
#define IDEM__LUA_DAY_ALL IDEM__LUA_DAY IDEM__LUA_COMMON

static const char *const idem__scripts[IDEM__LAYOUTS][IDEM__S_COUNT] = {
    {
        IDEM__LUA_HASH_ALL IDEM__LUA_GRANT("false") IDEM__LUA_CLAIM,
        IDEM__LUA_HASH_ALL IDEM__LUA_COMPLETE,
        IDEM__LUA_HASH_ALL IDEM__LUA_FAIL,
        IDEM__LUA_HASH_ALL IDEM__LUA_EXTEND,
        IDEM__LUA_HASH_ALL IDEM__LUA_GET,
        IDEM__LUA_HASH_ALL IDEM__LUA_FORGET,
        IDEM__LUA_CLOCK IDEM__LUA_SWEEP_HASH,
        IDEM__LUA_HASH_ALL IDEM__LUA_STATS_HASH,
        IDEM__LUA_HASH_ALL IDEM__LUA_DUMP_HASH,
        IDEM__LUA_HASH_ALL IDEM__LUA_IMPORT,
        IDEM__LUA_CLOCK IDEM__LUA_CHECK_HASH,
        IDEM__LUA_HASH_ALL IDEM__LUA_GRANT("true") IDEM__LUA_CLAIM,
        IDEM__LUA_CKPT_PUT,
        IDEM__LUA_CKPT_GET,
        IDEM__LUA_CKPT_CLEAR,
    },
    {
        IDEM__LUA_DAY_ALL IDEM__LUA_GRANT("false") IDEM__LUA_CLAIM,
        IDEM__LUA_DAY_ALL IDEM__LUA_COMPLETE,
        IDEM__LUA_DAY_ALL IDEM__LUA_FAIL,
        IDEM__LUA_DAY_ALL IDEM__LUA_EXTEND,
        IDEM__LUA_DAY_ALL IDEM__LUA_GET,
        IDEM__LUA_DAY_ALL IDEM__LUA_FORGET,
        IDEM__LUA_CLOCK IDEM__LUA_SWEEP_DAY,
        IDEM__LUA_CLOCK IDEM__LUA_STATS_DAY,
        IDEM__LUA_CLOCK IDEM__LUA_DUMP_DAY,
        IDEM__LUA_DAY_ALL IDEM__LUA_IMPORT,
        IDEM__LUA_CLOCK IDEM__LUA_CHECK_DAY,
        IDEM__LUA_DAY_ALL IDEM__LUA_GRANT("true") IDEM__LUA_CLAIM,
        IDEM__LUA_CKPT_PUT,
        IDEM__LUA_CKPT_GET,
        IDEM__LUA_CKPT_CLEAR,
    },
};

const char *idem__script_text(int layout, enum idem__script i)
{
    return idem__scripts[layout][i];
}

void idem__script_shas(int layout, char out[IDEM__S_COUNT][41])
{
    for (int i = 0; i < IDEM__S_COUNT; i++) {
        const char *text = idem__scripts[layout][i];
        unsigned char md[SHA_DIGEST_LENGTH];
        SHA1((const unsigned char *)text, strlen(text), md);
        for (int j = 0; j < SHA_DIGEST_LENGTH; j++)
            snprintf(&out[i][2 * j], 3, "%02x", md[j]);
    }
}
