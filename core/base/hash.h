/* SPDX-License-Identifier: MIT */
/*
 * hash.h - chunk identity (keyed XXH3-128) and record checksums (XXH3-64).
 *
 * A chunk is named by XXH3_128bits_withSecret(data, store secret).  The
 * secret is per store (generated once with ckpt_secret_generate() and kept
 * in the store metadata), so chunk names cannot be predicted or collided on
 * purpose by someone who does not know it.  Digests are kept in canonical
 * (big-endian, XXH128_canonicalFromHash) form: the 16 bytes, their hex form
 * and their memcmp order are identical on every host.
 *
 * ckpt_checksum() is the plain, unkeyed XXH3-64 (seed 0) used to detect
 * corruption of stored bytes and record headers.  Its value is part of the
 * on-disk format and never changes for the same input.
 *
 * Nothing here allocates except ckpt_hasher_new(); nothing aborts.
 */
#ifndef CKPT_HASH_H
#define CKPT_HASH_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#define CKPT_DIGEST_LEN 16
/* Bytes of per-store secret; must be >= XXH3_SECRET_SIZE_MIN (136). */
#define CKPT_SECRET_LEN 192
/* Minimum secret length accepted by ckpt_hasher_new() (== XXH3_SECRET_SIZE_MIN). */
#define CKPT_SECRET_LEN_MIN 136

/*
 * Chunk hash algorithms, in the spirit of git's hash_algos[]: every store
 * records the id of the algorithm its chunk names use (the 'M' "hash_algo"
 * record, docs/format.md), and a store whose id is not in this table is
 * refused at open.  Ids are never reused; 0 is never an id.  Today there is
 * one: keyed XXH3-128, the hasher below.
 */
#define CKPT_HASH_XXH3_128_KEYED 1
#define CKPT_HASH_ALGO_DEFAULT CKPT_HASH_XXH3_128_KEYED

struct ckpt_hash_algo {
	uint32_t id;       /* as stored */
	const char *name;  /* for messages */
	size_t digest_len; /* bytes of a digest */
	size_t secret_len; /* bytes of the secret a new store gets */
};

/* The algorithm with this id, or NULL if this ckptfs does not know it. */
const struct ckpt_hash_algo *ckpt_hash_algo_by_id(uint32_t id);
/* The known algorithms, in id order; NULL past the end. */
const struct ckpt_hash_algo *ckpt_hash_algo_at(size_t i);

/* A chunk digest in canonical byte order.  Public, plain value type. */
typedef struct ckpt_digest {
	uint8_t bytes[CKPT_DIGEST_LEN];
} ckpt_digest;

/*
 * Fill buf with len cryptographically random bytes from getrandom(2),
 * retrying on EINTR and short reads.  len may be 0.
 * Returns 0, or -EINVAL (buf NULL with len > 0), or the -errno of getrandom.
 * Thread-safe.
 */
int ckpt_secret_generate(uint8_t *buf, size_t len);

/*
 * Keyed hasher.  Opaque; owns a private copy of the secret and is immutable
 * after creation, so one hasher may be shared by any number of threads.
 */
typedef struct ckpt_hasher ckpt_hasher;

/*
 * Create a hasher keyed with secret[0..secret_len).  The bytes are copied;
 * the caller keeps ownership of secret.  The secret should be random (use
 * ckpt_secret_generate()); CKPT_SECRET_LEN bytes are recommended.
 * On success stores the new hasher in *ret_hasher (free with
 * ckpt_hasher_free()) and returns 0.
 * Errors: -EINVAL (NULL argument or secret_len < CKPT_SECRET_LEN_MIN),
 * -ENOMEM.  *ret_hasher is left untouched on error.
 */
int ckpt_hasher_new(const uint8_t *secret, size_t secret_len, ckpt_hasher **ret_hasher);

/* Free a hasher (wipes the secret copy).  Accepts NULL. */
void ckpt_hasher_free(ckpt_hasher *h);

/*
 * Keyed XXH3-128 of data[0..len) written to *ret_digest in canonical form.
 * h must come from ckpt_hasher_new(); data may be NULL when len is 0.
 * Cannot fail.  Thread-safe.
 */
void ckpt_hash_chunk(const ckpt_hasher *h, const void *data, size_t len,
		     ckpt_digest *ret_digest);

/*
 * The digest ckpt_hash_chunk() gives for the concatenation of iov[0..cnt),
 * computed without joining the pieces (streaming XXH3: same value).
 * Returns 0, or -ENOMEM when cnt > 1 and the hash state cannot be
 * allocated.  Thread-safe.
 */
int ckpt_hash_chunkv(const ckpt_hasher *h, const struct iovec *iov, int cnt,
		     ckpt_digest *ret_digest);

/*
 * Unkeyed XXH3-64 (seed 0) of data[0..len).  data may be NULL when len is 0.
 * Stable on-disk value.  Thread-safe.
 */
uint64_t ckpt_checksum(const void *data, size_t len);

/* Compare two digests in memcmp order: <0, 0 or >0. */
int ckpt_digest_cmp(const ckpt_digest *a, const ckpt_digest *b);

/* Write the 32 lowercase hex digits of d and a terminating NUL to out. */
void ckpt_digest_to_hex(const ckpt_digest *d, char out[2 * CKPT_DIGEST_LEN + 1]);

/*
 * Parse exactly 32 hex digits (either case) followed by NUL into
 * *ret_digest.  Returns 0, or -EINVAL for NULL, a wrong length or a
 * non-hex character; *ret_digest is left untouched on error.
 */
int ckpt_digest_from_hex(const char *hex, ckpt_digest *ret_digest);

#endif
