/*
 * status.c -- version, status and activation names, buffers, formatting
 * and SHA-256: the pieces every other part of the library uses.
 */
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *sf_version(void) { return SF_VERSION_STRING; }

const char *sf_errstr(int status) {
  switch (status) {
#define SF_STATUS_TEXT_(name, value, text) \
  case value:                              \
    return text;
    SF_STATUS_TABLE(SF_STATUS_TEXT_)
#undef SF_STATUS_TEXT_
  }
  return "unknown status";
}

const char *sf_status_name(int status) {
  switch (status) {
#define SF_STATUS_NAME_(name, value, text) \
  case value:                              \
    return #name;
    SF_STATUS_TABLE(SF_STATUS_NAME_)
#undef SF_STATUS_NAME_
  }
  return "SF_UNKNOWN";
}

const char *sf_activation_name(int activation) {
  switch (activation) {
#define SF_ACTIVATION_WORD_(name, value, word) \
  case value:                                  \
    return word;
    SF_ACTIVATION_TABLE(SF_ACTIVATION_WORD_)
#undef SF_ACTIVATION_WORD_
  }
  return NULL;
}

void sf_free_buffer(void *buffer) { free(buffer); }

void sf__vformat(char *buf, const char *fmt, va_list ap) {
  vsnprintf(buf, SF_MSG_MAX, fmt, ap);
}

char *sf__strdup(const char *s) {
  if (!s) return NULL;
  size_t n = strlen(s) + 1;
  char *d = malloc(n);
  if (d) memcpy(d, s, n);
  return d;
}

/* ---- SHA-256 (FIPS 180-4) ---------------------------------------------- */

static const uint32_t K256[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1,
    0x923f82a4, 0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3,
    0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786,
    0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147,
    0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13,
    0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
    0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a,
    0x5b9cca4f, 0x682e6ff3, 0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208,
    0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

#define ROTR(x, n) (((x) >> (n)) | ((x) << (32 - (n))))

/* `n` 64-byte blocks into `state`, in portable C. */
static void sha256_blocks_c(uint32_t state[8], const unsigned char *p, size_t n) {
  for (; n > 0; n--, p += 64) {
    uint32_t w[64], a, b, cc, d, e, f, g, h;
    for (int i = 0; i < 16; i++)
      w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 |
             (uint32_t)p[4 * i + 2] << 8 | (uint32_t)p[4 * i + 3];
    for (int i = 16; i < 64; i++) {
      uint32_t s0 = ROTR(w[i - 15], 7) ^ ROTR(w[i - 15], 18) ^ (w[i - 15] >> 3);
      uint32_t s1 = ROTR(w[i - 2], 17) ^ ROTR(w[i - 2], 19) ^ (w[i - 2] >> 10);
      w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    a = state[0]; b = state[1]; cc = state[2]; d = state[3];
    e = state[4]; f = state[5]; g = state[6]; h = state[7];
    for (int i = 0; i < 64; i++) {
      uint32_t s1 = ROTR(e, 6) ^ ROTR(e, 11) ^ ROTR(e, 25);
      uint32_t ch = (e & f) ^ (~e & g);
      uint32_t t1 = h + s1 + ch + K256[i] + w[i];
      uint32_t s0 = ROTR(a, 2) ^ ROTR(a, 13) ^ ROTR(a, 22);
      uint32_t mj = (a & b) ^ (a & cc) ^ (b & cc);
      uint32_t t2 = s0 + mj;
      h = g; g = f; f = e; e = d + t1; d = cc; cc = b; b = a; a = t1 + t2;
    }
    state[0] += a; state[1] += b; state[2] += cc; state[3] += d;
    state[4] += e; state[5] += f; state[6] += g; state[7] += h;
  }
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define SF_HAVE_SHA_NI 1
/* The same with the x86 SHA extensions (four rounds an instruction pair;
 * state kept as ABEF / CDGH, the instructions' order). */
__attribute__((target("sha,sse4.1"))) static void sha256_blocks_ni(uint32_t state[8],
                                                                    const unsigned char *p,
                                                                    size_t n) {
  const __m128i bswap = _mm_set_epi64x(0x0c0d0e0f08090a0bULL, 0x0405060700010203ULL);
  __m128i tmp = _mm_shuffle_epi32(_mm_loadu_si128((const __m128i *)&state[0]), 0xB1);
  __m128i st1 = _mm_shuffle_epi32(_mm_loadu_si128((const __m128i *)&state[4]), 0x1B);
  __m128i st0 = _mm_alignr_epi8(tmp, st1, 8);   /* ABEF */
  st1 = _mm_blend_epi16(st1, tmp, 0xF0);       /* CDGH */
  for (; n > 0; n--, p += 64) {
    const __m128i save0 = st0, save1 = st1;
    __m128i w[4];
    for (int i = 0; i < 4; i++)
      w[i] = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(p + 16 * i)), bswap);
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++) {
      __m128i msg = _mm_add_epi32(w[i & 3], _mm_loadu_si128((const __m128i *)&K256[4 * i]));
      st1 = _mm_sha256rnds2_epu32(st1, st0, msg);
      st0 = _mm_sha256rnds2_epu32(st0, st1, _mm_shuffle_epi32(msg, 0x0E));
      if (i < 12) {  /* words 4i+16 .. 4i+19 of the schedule */
        __m128i t = _mm_sha256msg1_epu32(w[i & 3], w[(i + 1) & 3]);
        t = _mm_add_epi32(t, _mm_alignr_epi8(w[(i + 3) & 3], w[(i + 2) & 3], 4));
        w[i & 3] = _mm_sha256msg2_epu32(t, w[(i + 3) & 3]);
      }
    }
    st0 = _mm_add_epi32(st0, save0);
    st1 = _mm_add_epi32(st1, save1);
  }
  tmp = _mm_shuffle_epi32(st0, 0x1B);          /* FEBA */
  st1 = _mm_shuffle_epi32(st1, 0xB1);          /* DCHG */
  st0 = _mm_blend_epi16(tmp, st1, 0xF0);       /* DCBA */
  st1 = _mm_alignr_epi8(st1, tmp, 8);          /* HGFE */
  _mm_storeu_si128((__m128i *)&state[0], st0);
  _mm_storeu_si128((__m128i *)&state[4], st1);
}
#endif

/* `n` blocks, with the SHA extensions where this CPU has them
 * ($SF_SHA256_PORTABLE set: always the portable code, for tests). */
static void sha256_blocks(uint32_t state[8], const unsigned char *p, size_t n) {
#ifdef SF_HAVE_SHA_NI
  static int use_ni = -1;
  if (use_ni < 0) {
    const char *env = getenv("SF_SHA256_PORTABLE");
    __builtin_cpu_init();
    use_ni = !(env && *env) && __builtin_cpu_supports("sha") &&
             __builtin_cpu_supports("sse4.1");
  }
  if (use_ni) {
    sha256_blocks_ni(state, p, n);
    return;
  }
#endif
  sha256_blocks_c(state, p, n);
}

void sf__sha256_init(sf__sha256 *c) {
  static const uint32_t iv[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372,
                                 0xa54ff53a, 0x510e527f, 0x9b05688c,
                                 0x1f83d9ab, 0x5be0cd19};
  memcpy(c->state, iv, sizeof iv);
  c->bitlen = 0;
  c->buflen = 0;
}

void sf__sha256_update(sf__sha256 *c, const void *data, size_t n) {
  const unsigned char *p = data;
  c->bitlen += (uint64_t)n * 8;
  if (c->buflen > 0) {  /* complete the buffered block first */
    size_t take = 64 - c->buflen;
    if (take > n) take = n;
    memcpy(c->buf + c->buflen, p, take);
    c->buflen += take;
    p += take;
    n -= take;
    if (c->buflen < 64) return;
    sha256_blocks(c->state, c->buf, 1);
    c->buflen = 0;
  }
  size_t whole = n / 64;  /* whole blocks straight from the input */
  if (whole) sha256_blocks(c->state, p, whole);
  p += whole * 64;
  n -= whole * 64;
  memcpy(c->buf, p, n);
  c->buflen = n;
}

void sf__sha256_final_hex(sf__sha256 *c, char hex_out[65]) {
  uint64_t bitlen = c->bitlen;
  unsigned char pad = 0x80;
  sf__sha256_update(c, &pad, 1);
  unsigned char zero = 0;
  while (c->buflen != 56) sf__sha256_update(c, &zero, 1);
  unsigned char len[8];
  for (int i = 0; i < 8; i++) len[i] = (unsigned char)(bitlen >> (56 - 8 * i));
  sf__sha256_update(c, len, 8);
  static const char digits[] = "0123456789abcdef";
  for (int i = 0; i < 8; i++)
    for (int j = 0; j < 4; j++) {
      unsigned char byte = (unsigned char)(c->state[i] >> (24 - 8 * j));
      hex_out[8 * i + 2 * j] = digits[byte >> 4];
      hex_out[8 * i + 2 * j + 1] = digits[byte & 15];
    }
  hex_out[64] = '\0';
}

sf_status sf_sha256_hex(const void *data, size_t size, char hex_out[65]) {
  if (!hex_out || (!data && size > 0)) return SF_ERR_INVALID_ARG;
  sf__sha256 c;
  sf__sha256_init(&c);
  sf__sha256_update(&c, data, size);
  sf__sha256_final_hex(&c, hex_out);
  return SF_OK;
}
