/* SPDX-License-Identifier: MIT */
/*
 * check_records.c - unit tests for core/meta/records.c: the key builders and
 * the encoders/decoders of every record (inode, dentry, chunk, extent list),
 * without an engine.
 *
 * Record layouts are checked byte by byte against docs/format.md: every
 * value starts with CKPT_REC_VERSION, integers in values are little-endian,
 * integers in keys big-endian.
 */
#include <check.h>
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include "chunk/pack_backend.h"
#include "meta/records.h"
#include "testlib.h"
#include "base/util.h"

/* ------------------------------------------------------------- keys */

START_TEST(test_keys)
{
	uint8_t key[CKPT_KEY_MAX];
	ckpt_digest d = tl_digest(3);
	char name[CKPT_NAME_MAX + 1];

	ck_assert_uint_eq(ckpt_key_ino(key, CKPT_KEY_INODE, 0x0102030405060708ull), 9);
	ck_assert_mem_eq(key, "I\x01\x02\x03\x04\x05\x06\x07\x08", 9);
	ck_assert_uint_eq(ckpt_key_ino(key, CKPT_KEY_ORPHAN, 1), 9);
	ck_assert_mem_eq(key, "O\0\0\0\0\0\0\0\x01", 9);
	ck_assert_uint_eq(ckpt_key_dentry(key, 0x10, "abc", 3), 12);
	ck_assert_mem_eq(key, "D\0\0\0\0\0\0\0\x10" "abc", 12);
	memset(name, 'n', CKPT_NAME_MAX);
	ck_assert_uint_eq(ckpt_key_dentry(key, 1, name, CKPT_NAME_MAX), CKPT_KEY_MAX);
	ck_assert_uint_eq(key[CKPT_KEY_MAX - 1], 'n');
	ck_assert_uint_eq(ckpt_key_chunk(key, &d), 17);
	ck_assert_uint_eq(key[0], 'C');
	ck_assert_mem_eq(key + 1, d.bytes, 16);
	ck_assert_uint_eq(ckpt_key_meta(key, "next_ino"), 9);
	ck_assert_mem_eq(key, "Mnext_ino", 9);
	/* the one-letter types are fixed on-disk values */
	ck_assert_int_eq(CKPT_KEY_META, 'M');
	ck_assert_int_eq(CKPT_KEY_CHUNK, 'C');
	ck_assert_int_eq(CKPT_KEY_INODE, 'I');
	ck_assert_int_eq(CKPT_KEY_DENTRY, 'D');
	ck_assert_int_eq(CKPT_KEY_FILE, 'F');
	ck_assert_int_eq(CKPT_KEY_LINK, 'L');
	ck_assert_int_eq(CKPT_KEY_ORPHAN, 'O');
	ck_assert_int_eq(CKPT_REC_VERSION, 1);
}
END_TEST

/* A dentry key names one entry of its directory: a damaged key is refused
 * rather than listed as "a/b", "", "." or a name cut at a NUL. */
START_TEST(test_key_dentry_decode)
{
	uint8_t key[CKPT_KEY_MAX + 1];
	char name[CKPT_NAME_MAX + 1];
	const char *got;
	uint64_t parent;
	size_t n, kl;
	static const char *const bad[] = { "a/b", "/", ".", "..", "a\0b" };
	static const size_t badlen[] = { 3, 1, 1, 2, 3 };

	kl = ckpt_key_dentry(key, 0x10, "model.safetensors", 17);
	ck_assert_int_eq(ckpt_key_dentry_decode(key, kl, &parent, &got, &n), 0);
	ck_assert_uint_eq(parent, 0x10);
	ck_assert_uint_eq(n, 17);
	ck_assert_mem_eq(got, "model.safetensors", 17);
	kl = ckpt_key_dentry(key, 1, "...", 3); /* an ordinary name */
	ck_assert_int_eq(ckpt_key_dentry_decode(key, kl, &parent, &got, &n), 0);
	memset(name, 'n', CKPT_NAME_MAX);
	kl = ckpt_key_dentry(key, 1, name, CKPT_NAME_MAX);
	ck_assert_int_eq(ckpt_key_dentry_decode(key, kl, &parent, &got, &n), 0);
	ck_assert_uint_eq(n, CKPT_NAME_MAX);
	key[kl] = 'n'; /* one byte longer than a name may be */
	ck_assert_int_eq(ckpt_key_dentry_decode(key, kl + 1, &parent, &got, &n), -EIO);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		kl = ckpt_key_dentry(key, 1, bad[i], badlen[i]);
		ck_assert_int_eq(ckpt_key_dentry_decode(key, kl, &parent, &got, &n), -EIO);
	}
	kl = ckpt_key_dentry(key, 1, "", 0);
	ck_assert_int_eq(ckpt_key_dentry_decode(key, kl, &parent, &got, &n), -EIO);
	kl = ckpt_key_dentry(key, 1, "x", 1);
	key[0] = CKPT_KEY_INODE;
	ck_assert_int_eq(ckpt_key_dentry_decode(key, kl, &parent, &got, &n), -EIO);
}
END_TEST

/* ------------------------------------------------------------ records */

START_TEST(test_inode_layout)
{
	struct ckpt_inode in = {
		.ino = 77,
		.mode = 0100644,
		.uid = 0x11223344,
		.gid = 0x55667788,
		.nlink = 3,
		.size = 0x0102030405060708ull,
		.atime_ns = -2,
		.mtime_ns = 0x1122334455667788ll,
		.ctime_ns = 1,
		.parent = 9,
		.flags = CKPT_INODE_F_SAFETENSORS,
		.generation = 0xfedcba9876543210ull,
	};
	struct ckpt_inode out;
	uint8_t buf[CKPT_INODE_REC_LEN + 1];
	static const uint8_t zero[8];

	ck_assert_int_eq(CKPT_INODE_REC_LEN, 80);
	memset(buf, 0xcc, sizeof(buf));
	ckpt_inode_encode(&in, buf);
	ck_assert_uint_eq(buf[0], CKPT_REC_VERSION);
	ck_assert_mem_eq(buf + 1, zero, 3);
	ck_assert_mem_eq(buf + 4, "\xa4\x81\x00\x00", 4); /* 0100644 = 0x81a4 */
	ck_assert_mem_eq(buf + 8, "\x44\x33\x22\x11", 4);
	ck_assert_mem_eq(buf + 12, "\x88\x77\x66\x55", 4);
	ck_assert_uint_eq(ckpt_get_le32(buf + 16), 3);
	ck_assert_uint_eq(ckpt_get_le32(buf + 20), CKPT_INODE_F_SAFETENSORS);
	ck_assert_mem_eq(buf + 24, "\x08\x07\x06\x05\x04\x03\x02\x01", 8);
	ck_assert_mem_eq(buf + 32, "\xfe\xff\xff\xff\xff\xff\xff\xff", 8);
	ck_assert_uint_eq(ckpt_get_le64(buf + 40), 0x1122334455667788ull);
	ck_assert_uint_eq(ckpt_get_le64(buf + 48), 1);
	ck_assert_uint_eq(ckpt_get_le64(buf + 56), 9);
	ck_assert_uint_eq(ckpt_get_le64(buf + 64), 0xfedcba9876543210ull);
	ck_assert_mem_eq(buf + 72, zero, 8);
	ck_assert_uint_eq(buf[80], 0xcc); /* no write past the record */

	memset(&out, 0, sizeof(out));
	ck_assert_int_eq(ckpt_inode_decode(1234, buf, CKPT_INODE_REC_LEN, &out), 0);
	ck_assert_uint_eq(out.ino, 1234); /* from the key, not the value */
	ck_assert_uint_eq(out.mode, in.mode);
	ck_assert_uint_eq(out.uid, in.uid);
	ck_assert_uint_eq(out.gid, in.gid);
	ck_assert_uint_eq(out.nlink, in.nlink);
	ck_assert_uint_eq(out.size, in.size);
	ck_assert_int_eq(out.atime_ns, -2);
	ck_assert_int_eq(out.mtime_ns, in.mtime_ns);
	ck_assert_int_eq(out.ctime_ns, in.ctime_ns);
	ck_assert_uint_eq(out.parent, in.parent);
	ck_assert_uint_eq(out.flags, in.flags);
	ck_assert_uint_eq(out.generation, in.generation);

	/* wrong length or version */
	ck_assert_int_eq(ckpt_inode_decode(1, buf, CKPT_INODE_REC_LEN - 1, &out), -EIO);
	ck_assert_int_eq(ckpt_inode_decode(1, buf, CKPT_INODE_REC_LEN + 1, &out), -EIO);
	ck_assert_int_eq(ckpt_inode_decode(1, buf, 0, &out), -EIO);
	buf[0] = 3;
	ck_assert_int_eq(ckpt_inode_decode(1, buf, CKPT_INODE_REC_LEN, &out), -EIO);
	buf[0] = 0;
	ck_assert_int_eq(ckpt_inode_decode(1, buf, CKPT_INODE_REC_LEN, &out), -EIO);
}
END_TEST

/* Device nodes: version 2 with major and minor at 72 and 76; every other
 * inode stays version 1, whose bytes 72..79 are not read. */
START_TEST(test_inode_rdev_layout)
{
	struct ckpt_inode in = {
		.ino = 7,
		.mode = S_IFCHR | 0620,
		.nlink = 1,
		.generation = 1,
		.rdev = makedev(259, 70000),
	};
	struct ckpt_inode out;
	uint8_t buf[CKPT_INODE_REC_LEN];

	ckpt_inode_encode(&in, buf);
	ck_assert_uint_eq(buf[0], CKPT_INODE_REC_VERSION_RDEV);
	ck_assert_uint_eq(CKPT_INODE_REC_VERSION_RDEV, 2);
	ck_assert_uint_eq(ckpt_get_le32(buf + 4), S_IFCHR | 0620);
	ck_assert_uint_eq(ckpt_get_le32(buf + 72), 259);
	ck_assert_uint_eq(ckpt_get_le32(buf + 76), 70000);
	memset(&out, 0, sizeof(out));
	ck_assert_int_eq(ckpt_inode_decode(7, buf, sizeof(buf), &out), 0);
	ck_assert_uint_eq(out.rdev, makedev(259, 70000));
	ck_assert_uint_eq(major(out.rdev), 259);
	ck_assert_uint_eq(minor(out.rdev), 70000);
	ck_assert_uint_eq(out.mode, S_IFCHR | 0620);

	/* a block device 0:0 and a fifo have no device number: version 1 */
	in.mode = S_IFBLK | 0600;
	in.rdev = 0;
	ckpt_inode_encode(&in, buf);
	ck_assert_uint_eq(buf[0], CKPT_REC_VERSION);
	in.mode = S_IFIFO | 0644;
	ckpt_inode_encode(&in, buf);
	ck_assert_uint_eq(buf[0], CKPT_REC_VERSION);
	ck_assert_uint_eq(ckpt_get_le64(buf + 72), 0);

	/* version 1 with non-zero reserved bytes: no device number */
	ckpt_put_le32(buf + 72, 8);
	ckpt_put_le32(buf + 76, 1);
	ck_assert_int_eq(ckpt_inode_decode(7, buf, sizeof(buf), &out), 0);
	ck_assert_uint_eq(out.rdev, 0);
	ck_assert_uint_eq(out.mode, S_IFIFO | 0644);
}
END_TEST

START_TEST(test_dentry_layout)
{
	uint8_t buf[CKPT_DENTRY_REC_LEN];
	uint64_t ino = 0;
	uint32_t mode = 0;

	ck_assert_int_eq(CKPT_DENTRY_REC_LEN, 16);
	memset(buf, 0xcc, sizeof(buf));
	ckpt_dentry_encode(0x0a0b0c0d0e0f1011ull, 0040000, buf);
	ck_assert_mem_eq(buf, "\x01\0\0\0" "\x00\x40\x00\x00" "\x11\x10\x0f\x0e\x0d\x0c\x0b\x0a",
			 16);
	ck_assert_int_eq(ckpt_dentry_decode(buf, sizeof(buf), &ino, &mode), 0);
	ck_assert_uint_eq(ino, 0x0a0b0c0d0e0f1011ull);
	ck_assert_uint_eq(mode, 0040000);
	ck_assert_int_eq(ckpt_dentry_decode(buf, 15, &ino, &mode), -EIO);
	ck_assert_int_eq(ckpt_dentry_decode(buf, 17, &ino, &mode), -EIO);
	buf[0] = 2;
	ck_assert_int_eq(ckpt_dentry_decode(buf, sizeof(buf), &ino, &mode), -EIO);
}
END_TEST

START_TEST(test_chunk_rec_layout)
{
	struct ckpt_chunk_loc loc = {
		.stored_len = 0xa1b2c3d4,
		.raw_len = 0x00100000,
		.codec = 3,
	}, out;
	uint8_t buf[CKPT_CHUNK_REC_LEN];
	uint64_t refs = 0;
	static const uint8_t zero[4];

	/* the pack backend's where: the pack id and offset fields of format 1 */
	ckpt_pack_loc_set(&loc, 0x0102030405060708ull, 0x1000);
	ck_assert_int_eq(CKPT_CHUNK_REC_LEN, 40);
	memset(buf, 0xcc, sizeof(buf));
	ckpt_chunk_rec_encode(&loc, 0x8877665544332211ull, buf);
	ck_assert_uint_eq(buf[0], CKPT_REC_VERSION);
	ck_assert_uint_eq(buf[1], 3);
	ck_assert_mem_eq(buf + 2, zero, 2);
	ck_assert_mem_eq(buf + 4, "\xd4\xc3\xb2\xa1", 4);
	ck_assert_mem_eq(buf + 8, "\x00\x00\x10\x00", 4);
	ck_assert_mem_eq(buf + 12, zero, 4);
	ck_assert_mem_eq(buf + 16, "\x08\x07\x06\x05\x04\x03\x02\x01", 8);
	ck_assert_uint_eq(ckpt_get_le64(buf + 24), 0x1000);
	ck_assert_mem_eq(buf + 32, "\x11\x22\x33\x44\x55\x66\x77\x88", 8);

	memset(&out, 0, sizeof(out));
	ck_assert_int_eq(ckpt_chunk_rec_decode(buf, sizeof(buf), &out, &refs), 0);
	ck_assert_uint_eq(ckpt_pack_loc_id(&out), 0x0102030405060708ull);
	ck_assert_uint_eq(ckpt_pack_loc_offset(&out), 0x1000);
	ck_assert_uint_eq(out.stored_len, loc.stored_len);
	ck_assert_uint_eq(out.raw_len, loc.raw_len);
	ck_assert_uint_eq(out.codec, loc.codec);
	ck_assert_uint_eq(refs, 0x8877665544332211ull);
	/* refcount output is optional */
	ck_assert_int_eq(ckpt_chunk_rec_decode(buf, sizeof(buf), &out, NULL), 0);
	ck_assert_int_eq(ckpt_chunk_rec_decode(buf, 39, &out, &refs), -EIO);
	ck_assert_int_eq(ckpt_chunk_rec_decode(buf, 41, &out, &refs), -EIO);
	buf[0] = 0;
	ck_assert_int_eq(ckpt_chunk_rec_decode(buf, sizeof(buf), &out, &refs), -EIO);
}
END_TEST

/* ------------------------------------------------------- extent lists */

static struct ckpt_extent_list *list3(void)
{
	/* [0,100) chunk 1, [100,150) zero, [150,350) chunk 2 */
	struct ckpt_extent_list *l = ckpt_extent_list_new();
	ckpt_digest d1 = tl_digest(1), d2 = tl_digest(2);

	ck_assert_ptr_nonnull(l);
	ck_assert_int_eq(ckpt_extent_list_append(l, 100, CKPT_EXT_CHUNK, &d1), 0);
	ck_assert_int_eq(ckpt_extent_list_append(l, 50, CKPT_EXT_ZERO, NULL), 0);
	ck_assert_int_eq(ckpt_extent_list_append(l, 200, CKPT_EXT_CHUNK, &d2), 0);
	return l;
}

START_TEST(test_extent_append)
{
	struct ckpt_extent_list *l = ckpt_extent_list_new();
	ckpt_digest d1 = tl_digest(1), zero;

	memset(&zero, 0, sizeof(zero));
	ck_assert_ptr_nonnull(l);
	ck_assert_uint_eq(l->n, 0);
	ck_assert_uint_eq(l->size, 0);
	/* zero length: ignored */
	ck_assert_int_eq(ckpt_extent_list_append(l, 0, CKPT_EXT_CHUNK, &d1), 0);
	ck_assert_uint_eq(l->n, 0);
	ck_assert_int_eq(ckpt_extent_list_append(l, 10, CKPT_EXT_ZERO, &d1), 0);
	/* the digest of a zero extent is zero whatever was passed */
	ck_assert_mem_eq(l->v[0].digest.bytes, zero.bytes, 16);
	/* zero runs merge */
	ck_assert_int_eq(ckpt_extent_list_append(l, 20, CKPT_EXT_ZERO, NULL), 0);
	ck_assert_uint_eq(l->n, 1);
	ck_assert_uint_eq(l->v[0].len, 30);
	ck_assert_uint_eq(l->size, 30);
	ck_assert_int_eq(ckpt_extent_list_append(l, 5, CKPT_EXT_CHUNK, &d1), 0);
	/* zero after chunk: new extent; chunk after chunk: never merged */
	ck_assert_int_eq(ckpt_extent_list_append(l, 7, CKPT_EXT_ZERO, NULL), 0);
	ck_assert_int_eq(ckpt_extent_list_append(l, 5, CKPT_EXT_CHUNK, &d1), 0);
	ck_assert_int_eq(ckpt_extent_list_append(l, 5, CKPT_EXT_CHUNK, &d1), 0);
	ck_assert_uint_eq(l->n, 5);
	ck_assert_uint_eq(l->v[1].off, 30);
	ck_assert_uint_eq(l->v[1].kind, CKPT_EXT_CHUNK);
	ck_assert_mem_eq(l->v[1].digest.bytes, d1.bytes, 16);
	ck_assert_uint_eq(l->v[2].off, 35);
	ck_assert_uint_eq(l->v[2].len, 7);
	ck_assert_uint_eq(l->v[3].off, 42);
	ck_assert_uint_eq(l->v[4].off, 47);
	ck_assert_uint_eq(l->size, 52);
	/* a chunk extent without a digest gets the zero digest */
	ck_assert_int_eq(ckpt_extent_list_append(l, 1, CKPT_EXT_CHUNK, NULL), 0);
	ck_assert_mem_eq(l->v[5].digest.bytes, zero.bytes, 16);
	ckpt_extent_list_free(l);

	/* merging stops where the length would not fit in 32 bits */
	l = ckpt_extent_list_new();
	ck_assert_int_eq(ckpt_extent_list_append(l, UINT32_MAX - 10, CKPT_EXT_ZERO, NULL), 0);
	ck_assert_int_eq(ckpt_extent_list_append(l, 10, CKPT_EXT_ZERO, NULL), 0);
	ck_assert_uint_eq(l->n, 1);
	ck_assert_uint_eq(l->v[0].len, UINT32_MAX);
	ck_assert_int_eq(ckpt_extent_list_append(l, 1, CKPT_EXT_ZERO, NULL), 0);
	ck_assert_uint_eq(l->n, 2);
	ck_assert_uint_eq(l->v[1].off, UINT32_MAX);
	ck_assert_uint_eq(l->size, (uint64_t)UINT32_MAX + 1);
	ckpt_extent_list_free(l);
	ckpt_extent_list_free(NULL);
}
END_TEST

START_TEST(test_extent_many)
{
	struct ckpt_extent_list *l = ckpt_extent_list_new();

	for (uint32_t i = 0; i < 1000; i++) {
		ckpt_digest d = tl_digest((uint8_t)i);
		ck_assert_int_eq(ckpt_extent_list_append(l, i + 1, CKPT_EXT_CHUNK, &d), 0);
	}
	ck_assert_uint_eq(l->n, 1000);
	ck_assert_uint_eq(l->size, 1000ull * 1001 / 2);
	for (uint32_t i = 0; i < 1000; i++) {
		uint64_t off = (uint64_t)i * (i + 1) / 2;
		ck_assert_uint_eq(l->v[i].off, off);
		ck_assert_uint_eq(ckpt_extent_list_find(l, off), i);
		ck_assert_uint_eq(ckpt_extent_list_find(l, off + i), i); /* last byte */
	}
	ck_assert_uint_eq(ckpt_extent_list_find(l, l->size), 1000);
	ckpt_extent_list_free(l);
}
END_TEST

START_TEST(test_extent_find)
{
	struct ckpt_extent_list *l = ckpt_extent_list_new();

	ck_assert_uint_eq(ckpt_extent_list_find(l, 0), 0); /* empty: n */
	ck_assert_uint_eq(ckpt_extent_list_find(l, 5), 0);
	ckpt_extent_list_free(l);

	l = list3();
	ck_assert_uint_eq(ckpt_extent_list_find(l, 0), 0);
	ck_assert_uint_eq(ckpt_extent_list_find(l, 99), 0);
	ck_assert_uint_eq(ckpt_extent_list_find(l, 100), 1);
	ck_assert_uint_eq(ckpt_extent_list_find(l, 149), 1);
	ck_assert_uint_eq(ckpt_extent_list_find(l, 150), 2);
	ck_assert_uint_eq(ckpt_extent_list_find(l, 349), 2);
	ck_assert_uint_eq(ckpt_extent_list_find(l, 350), 3);
	ck_assert_uint_eq(ckpt_extent_list_find(l, UINT64_MAX), 3);
	ckpt_extent_list_free(l);

	/* single extent */
	l = ckpt_extent_list_new();
	ck_assert_int_eq(ckpt_extent_list_append(l, 1, CKPT_EXT_ZERO, NULL), 0);
	ck_assert_uint_eq(ckpt_extent_list_find(l, 0), 0);
	ck_assert_uint_eq(ckpt_extent_list_find(l, 1), 1);
	ckpt_extent_list_free(l);
}
END_TEST

START_TEST(test_extent_truncate)
{
	struct ckpt_extent_list *l = list3();
	ckpt_digest d2 = tl_digest(2), d3 = tl_digest(3);

	/* past or at the end: no change */
	ckpt_extent_list_truncate(l, 1000);
	ckpt_extent_list_truncate(l, 350);
	ck_assert_uint_eq(l->n, 3);
	ck_assert_uint_eq(l->size, 350);
	/* mid-extent: shortened, still names its chunk */
	ckpt_extent_list_truncate(l, 200);
	ck_assert_uint_eq(l->n, 3);
	ck_assert_uint_eq(l->v[2].len, 50);
	ck_assert_uint_eq(l->v[2].off, 150);
	ck_assert_mem_eq(l->v[2].digest.bytes, d2.bytes, 16);
	ck_assert_uint_eq(l->size, 200);
	/* at an extent boundary: the extent goes */
	ckpt_extent_list_truncate(l, 150);
	ck_assert_uint_eq(l->n, 2);
	ck_assert_uint_eq(l->size, 150);
	/* inside a zero run */
	ckpt_extent_list_truncate(l, 101);
	ck_assert_uint_eq(l->n, 2);
	ck_assert_uint_eq(l->v[1].len, 1);
	ck_assert_uint_eq(l->size, 101);
	/* appending continues from the new end */
	ck_assert_int_eq(ckpt_extent_list_append(l, 9, CKPT_EXT_CHUNK, &d3), 0);
	ck_assert_uint_eq(l->v[2].off, 101);
	ck_assert_uint_eq(l->size, 110);
	ck_assert_uint_eq(ckpt_extent_list_find(l, 105), 2);
	/* to zero */
	ckpt_extent_list_truncate(l, 0);
	ck_assert_uint_eq(l->n, 0);
	ck_assert_uint_eq(l->size, 0);
	ck_assert_uint_eq(ckpt_extent_list_find(l, 0), 0);
	ckpt_extent_list_free(l);
}
END_TEST

START_TEST(test_extent_dup)
{
	struct ckpt_extent_list *l = list3(), *c, *e;

	c = ckpt_extent_list_dup(l);
	ck_assert_ptr_nonnull(c);
	ck_assert_uint_eq(c->n, 3);
	ck_assert_uint_eq(c->size, 350);
	ck_assert_ptr_ne(c->v, l->v);
	ck_assert_mem_eq(c->v, l->v, 3 * sizeof(*l->v));
	/* independent */
	ckpt_extent_list_truncate(c, 10);
	ck_assert_int_eq(ckpt_extent_list_append(c, 5, CKPT_EXT_ZERO, NULL), 0);
	ck_assert_uint_eq(l->n, 3);
	ck_assert_uint_eq(l->v[0].len, 100);
	ck_assert_uint_eq(l->size, 350);
	ckpt_extent_list_free(c);
	/* of an empty list */
	e = ckpt_extent_list_new();
	c = ckpt_extent_list_dup(e);
	ck_assert_ptr_nonnull(c);
	ck_assert_uint_eq(c->n, 0);
	ck_assert_uint_eq(c->size, 0);
	ck_assert_int_eq(ckpt_extent_list_append(c, 5, CKPT_EXT_ZERO, NULL), 0);
	ckpt_extent_list_free(c);
	ckpt_extent_list_free(e);
	ckpt_extent_list_free(l);
}
END_TEST

START_TEST(test_extent_encode_layout)
{
	struct ckpt_extent_list *l = list3(), *out = NULL;
	ckpt_digest d1 = tl_digest(1), d2 = tl_digest(2);
	static const uint8_t zero[16];
	uint8_t *buf = NULL;
	size_t len = 0;

	ck_assert_int_eq(ckpt_extent_list_encode(l, &buf, &len), 0);
	ck_assert_uint_eq(len, CKPT_FILE_HDR_LEN + 3 * CKPT_FILE_ENT_LEN);
	ck_assert_uint_eq(len, 16 + 72);
	/* header: version, 3 pad, count le32, size le64 */
	ck_assert_mem_eq(buf, "\x01\0\0\0" "\x03\0\0\0" "\x5e\x01\0\0\0\0\0\0", 16);
	/* entry: len le32, kind, 3 pad, digest */
	ck_assert_mem_eq(buf + 16, "\x64\0\0\0" "\0\0\0\0", 8);
	ck_assert_mem_eq(buf + 24, d1.bytes, 16);
	ck_assert_mem_eq(buf + 40, "\x32\0\0\0" "\x01\0\0\0", 8);
	ck_assert_mem_eq(buf + 48, zero, 16);
	ck_assert_mem_eq(buf + 64, "\xc8\0\0\0" "\0\0\0\0", 8);
	ck_assert_mem_eq(buf + 72, d2.bytes, 16);

	ck_assert_int_eq(ckpt_extent_list_decode(buf, len, &out), 0);
	ck_assert_uint_eq(out->n, 3);
	ck_assert_uint_eq(out->size, 350);
	for (size_t i = 0; i < 3; i++) {
		ck_assert_uint_eq(out->v[i].off, l->v[i].off);
		ck_assert_uint_eq(out->v[i].len, l->v[i].len);
		ck_assert_uint_eq(out->v[i].kind, l->v[i].kind);
		ck_assert_mem_eq(out->v[i].digest.bytes, l->v[i].digest.bytes, 16);
	}
	/* the decoded list is a normal list */
	ck_assert_int_eq(ckpt_extent_list_append(out, 50, CKPT_EXT_ZERO, NULL), 0);
	ck_assert_uint_eq(out->size, 400);
	ck_assert_uint_eq(ckpt_extent_list_find(out, 120), 1);
	ckpt_extent_list_free(out);
	free(buf);

	/* an empty list is a bare header */
	ckpt_extent_list_free(l);
	l = ckpt_extent_list_new();
	ck_assert_int_eq(ckpt_extent_list_encode(l, &buf, &len), 0);
	ck_assert_uint_eq(len, 16);
	ck_assert_mem_eq(buf, "\x01\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0", 16);
	out = NULL;
	ck_assert_int_eq(ckpt_extent_list_decode(buf, len, &out), 0);
	ck_assert_uint_eq(out->n, 0);
	ck_assert_uint_eq(out->size, 0);
	ckpt_extent_list_free(out);
	free(buf);
	ckpt_extent_list_free(l);
}
END_TEST

static void expect_decode_eio(const uint8_t *buf, size_t len)
{
	struct ckpt_extent_list *out = (struct ckpt_extent_list *)0x1;

	ck_assert_int_eq(ckpt_extent_list_decode(buf, len, &out), -EIO);
	ck_assert_ptr_eq(out, (struct ckpt_extent_list *)0x1); /* untouched */
}

START_TEST(test_extent_decode_corrupt)
{
	struct ckpt_extent_list *l = list3();
	uint8_t *buf, *bad;
	size_t len;

	ck_assert_int_eq(ckpt_extent_list_encode(l, &buf, &len), 0);
	bad = malloc(len + CKPT_FILE_ENT_LEN);
	ck_assert_ptr_nonnull(bad);

	/* too short for a header */
	expect_decode_eio(buf, 0);
	expect_decode_eio(buf, 15);
	/* version */
	memcpy(bad, buf, len);
	bad[0] = 2;
	expect_decode_eio(bad, len);
	bad[0] = 0;
	expect_decode_eio(bad, len);
	/* count does not match the length */
	memcpy(bad, buf, len);
	ckpt_put_le32(bad + 4, 2);
	expect_decode_eio(bad, len);
	ckpt_put_le32(bad + 4, 4);
	expect_decode_eio(bad, len);
	ckpt_put_le32(bad + 4, 0xffffffffu);
	expect_decode_eio(bad, len);
	/* truncated by one entry (count still 3) */
	expect_decode_eio(buf, len - CKPT_FILE_ENT_LEN);
	/* a partial entry at the end */
	expect_decode_eio(buf, len - 1);
	memcpy(bad, buf, len);
	bad[len] = 0;
	expect_decode_eio(bad, len + 1);
	/* size does not match the sum of lengths */
	memcpy(bad, buf, len);
	ckpt_put_le64(bad + 8, 351);
	expect_decode_eio(bad, len);
	ckpt_put_le64(bad + 8, 349);
	expect_decode_eio(bad, len);
	/* zero-length extent (size adjusted so only that is wrong) */
	memcpy(bad, buf, len);
	ckpt_put_le32(bad + 16 + CKPT_FILE_ENT_LEN, 0);
	ckpt_put_le64(bad + 8, 300);
	expect_decode_eio(bad, len);
	/* unknown kind */
	memcpy(bad, buf, len);
	bad[16 + 4] = 2;
	expect_decode_eio(bad, len);
	bad[16 + 4] = 0xff;
	expect_decode_eio(bad, len);
	/* sanity: the unmodified copy decodes */
	memcpy(bad, buf, len);
	{
		struct ckpt_extent_list *ok = NULL;
		ck_assert_int_eq(ckpt_extent_list_decode(bad, len, &ok), 0);
		ckpt_extent_list_free(ok);
	}
	free(bad);
	free(buf);
	ckpt_extent_list_free(l);
}
END_TEST

static Suite *records_suite(void)
{
	Suite *s = suite_create("records");
	TCase *rec = tcase_create("records");

	tcase_add_test(rec, test_keys);
	tcase_add_test(rec, test_key_dentry_decode);
	tcase_add_test(rec, test_inode_layout);
	tcase_add_test(rec, test_inode_rdev_layout);
	tcase_add_test(rec, test_dentry_layout);
	tcase_add_test(rec, test_chunk_rec_layout);
	tcase_add_test(rec, test_extent_append);
	tcase_add_test(rec, test_extent_many);
	tcase_add_test(rec, test_extent_find);
	tcase_add_test(rec, test_extent_truncate);
	tcase_add_test(rec, test_extent_dup);
	tcase_add_test(rec, test_extent_encode_layout);
	tcase_add_test(rec, test_extent_decode_corrupt);
	suite_add_tcase(s, rec);
	return s;
}

int main(void)
{
	return tl_run(records_suite());
}
