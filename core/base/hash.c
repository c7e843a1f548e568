// SPDX-License-Identifier: MIT
/*
 * hash.c - keyed XXH3-128 chunk digests and XXH3-64 checksums.
 */
#include "base/hash.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include "base/xxh.h"

#include "base/util.h"

_Static_assert(CKPT_SECRET_LEN_MIN == XXH3_SECRET_SIZE_MIN, "secret minimum mismatch");
_Static_assert(CKPT_SECRET_LEN >= XXH3_SECRET_SIZE_MIN, "default secret too short");
_Static_assert(sizeof(XXH128_canonical_t) == CKPT_DIGEST_LEN, "digest size mismatch");

static const struct ckpt_hash_algo hash_algos[] = {
	{ CKPT_HASH_XXH3_128_KEYED, "xxh3-128-keyed", CKPT_DIGEST_LEN, CKPT_SECRET_LEN },
};

const struct ckpt_hash_algo *ckpt_hash_algo_at(size_t i)
{
	return i < CKPT_ARRAY_SIZE(hash_algos) ? &hash_algos[i] : NULL;
}

const struct ckpt_hash_algo *ckpt_hash_algo_by_id(uint32_t id)
{
	for (size_t i = 0; i < CKPT_ARRAY_SIZE(hash_algos); i++)
		if (hash_algos[i].id == id)
			return &hash_algos[i];
	return NULL;
}

struct ckpt_hasher {
	size_t secret_len;
	uint8_t secret[]; /* secret_len bytes */
};

int ckpt_secret_generate(uint8_t *buf, size_t len)
{
	size_t done = 0;

	if (!buf && len)
		return -EINVAL;
	while (done < len) {
		ssize_t n = getrandom(buf + done, len - done, 0);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		done += (size_t)n;
	}
	return 0;
}

int ckpt_hasher_new(const uint8_t *secret, size_t secret_len, ckpt_hasher **ret_hasher)
{
	ckpt_hasher *h;

	if (!secret || !ret_hasher || secret_len < CKPT_SECRET_LEN_MIN)
		return -EINVAL;
	h = malloc(sizeof(*h) + secret_len);
	if (!h)
		return -ENOMEM;
	h->secret_len = secret_len;
	memcpy(h->secret, secret, secret_len);
	*ret_hasher = h;
	return 0;
}

void ckpt_hasher_free(ckpt_hasher *h)
{
	if (!h)
		return;
	explicit_bzero(h->secret, h->secret_len);
	free(h);
}

void ckpt_hash_chunk(const ckpt_hasher *h, const void *data, size_t len,
		     ckpt_digest *ret_digest)
{
	XXH128_hash_t v = XXH3_128bits_withSecret(data, len, h->secret, h->secret_len);
	XXH128_canonical_t c;

	XXH128_canonicalFromHash(&c, v);
	memcpy(ret_digest->bytes, c.digest, CKPT_DIGEST_LEN);
}

int ckpt_hash_chunkv(const ckpt_hasher *h, const struct iovec *iov, int cnt,
		     ckpt_digest *ret_digest)
{
	XXH3_state_t *st;
	XXH128_canonical_t c;

	if (cnt == 1) {
		ckpt_hash_chunk(h, iov[0].iov_base, iov[0].iov_len, ret_digest);
		return 0;
	}
	/* The state's size is private to the library (XXH_STATIC_LINKING_ONLY
	 * would bake it into this binary), so it is allocated. */
	st = XXH3_createState();
	if (!st)
		return -ENOMEM;
	/* Cannot fail: the secret was checked in ckpt_hasher_new(). */
	(void)XXH3_128bits_reset_withSecret(st, h->secret, h->secret_len);
	for (int i = 0; i < cnt; i++)
		(void)XXH3_128bits_update(st, iov[i].iov_base, iov[i].iov_len);
	XXH128_canonicalFromHash(&c, XXH3_128bits_digest(st));
	XXH3_freeState(st);
	memcpy(ret_digest->bytes, c.digest, CKPT_DIGEST_LEN);
	return 0;
}

uint64_t ckpt_checksum(const void *data, size_t len)
{
	return XXH3_64bits(data, len);
}


int ckpt_digest_cmp(const ckpt_digest *a, const ckpt_digest *b)
{
	return memcmp(a->bytes, b->bytes, CKPT_DIGEST_LEN);
}

void ckpt_digest_to_hex(const ckpt_digest *d, char out[2 * CKPT_DIGEST_LEN + 1])
{
	static const char digits[] = "0123456789abcdef";

	for (size_t i = 0; i < CKPT_DIGEST_LEN; i++) {
		out[2 * i] = digits[d->bytes[i] >> 4];
		out[2 * i + 1] = digits[d->bytes[i] & 0xf];
	}
	out[2 * CKPT_DIGEST_LEN] = '\0';
}

static int hex_val(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

int ckpt_digest_from_hex(const char *hex, ckpt_digest *ret_digest)
{
	ckpt_digest d;

	if (!hex || !ret_digest)
		return -EINVAL;
	for (size_t i = 0; i < CKPT_DIGEST_LEN; i++) {
		int hi, lo;

		/* A NUL in either position stops here before reading past it. */
		hi = hex_val(hex[2 * i]);
		if (hi < 0)
			return -EINVAL;
		lo = hex_val(hex[2 * i + 1]);
		if (lo < 0)
			return -EINVAL;
		d.bytes[i] = (uint8_t)(hi << 4 | lo);
	}
	if (hex[2 * CKPT_DIGEST_LEN] != '\0')
		return -EINVAL;
	*ret_digest = d;
	return 0;
}
