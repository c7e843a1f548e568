// SPDX-License-Identifier: MIT
/*
 * chunker.c - FastCDC cut-point finder (see chunker.h for the exact rules).
 */
#include "chunk/chunker.h"

#include <errno.h>

#include "base/util.h"

/*
 * gear[i] = i-th output of splitmix64 seeded with 0x636b707466732131.
 * Generated once with a small script; tests/check_chunker.c regenerates the
 * table and checks cut points against it.  Never edit (see chunker.h).
 */
static const uint64_t gear[256] = {
	UINT64_C(0xd1974b2f656b3fa4), UINT64_C(0xe3a2a35ef68577ab), UINT64_C(0x7ef4deb1765ea8bf),
	UINT64_C(0xa94a92084095ffec), UINT64_C(0x651e271b4dac6334), UINT64_C(0x03109a10b4fd5e22),
	UINT64_C(0x65b286aa94a673e3), UINT64_C(0x9f08c418b0327b82), UINT64_C(0x8d6922a325a2fdeb),
	UINT64_C(0xedce4dd36d7f521c), UINT64_C(0x06b833677de71404), UINT64_C(0xdec42b7770601950),
	UINT64_C(0x8dd7ffee9c56535b), UINT64_C(0xdea6a6592647a4d1), UINT64_C(0x7d5ffa4e1519693b),
	UINT64_C(0xb3a38bc0a93f60f6), UINT64_C(0x5605a5fe08198059), UINT64_C(0x7227360f184bad27),
	UINT64_C(0xa0ba996b6c4ca451), UINT64_C(0x2ab5669a8062e27e), UINT64_C(0x3c4bdc1fb2a957ce),
	UINT64_C(0x142106750b157a8f), UINT64_C(0x87c223587b72bdda), UINT64_C(0xbee481e5b42094b8),
	UINT64_C(0xda7dc0507557cad3), UINT64_C(0xb6486c318185e0f6), UINT64_C(0x06131cc83669fa52),
	UINT64_C(0x986a84b1c0bd7c4e), UINT64_C(0x0c44953bde5a4716), UINT64_C(0xb7d924b61d55ea77),
	UINT64_C(0xf568fdfeab061f80), UINT64_C(0x1c3dd0db43d4856b), UINT64_C(0x645734ea001cac6f),
	UINT64_C(0x3556f3eb5029d74f), UINT64_C(0x0839132e08e8d6a3), UINT64_C(0x453386cd73688762),
	UINT64_C(0x92c59368a0bc775a), UINT64_C(0xcb79f15db0b06d9a), UINT64_C(0x8dc6eb74141f5437),
	UINT64_C(0x4c62879f41eef252), UINT64_C(0xa11478cbecc4e4fe), UINT64_C(0x1d132451793c3093),
	UINT64_C(0x228c36cc0aa741ca), UINT64_C(0x490092f00b4b28e0), UINT64_C(0x3b73cdd6e30b0bc0),
	UINT64_C(0x32a6b0a2ad69898f), UINT64_C(0x4a64e917db05e052), UINT64_C(0xd5a6bd71062273f8),
	UINT64_C(0xd25fd4f5f733ae86), UINT64_C(0xe391cc701f64478e), UINT64_C(0x392e00444ddc4e5f),
	UINT64_C(0xb52c60a47e6af91d), UINT64_C(0x53679c04742e2435), UINT64_C(0x4e40b6841b05a7c6),
	UINT64_C(0x27962df107612b96), UINT64_C(0xaaf339134a54f7e9), UINT64_C(0x45f3438e0667a1fd),
	UINT64_C(0xcc244fd3767da446), UINT64_C(0xa534ade642d34e20), UINT64_C(0xc4f19cc101a9c968),
	UINT64_C(0x9eeff7339d65b800), UINT64_C(0x285b414c6a72ca39), UINT64_C(0xeb1ec4a48a6b8ac8),
	UINT64_C(0xbb2d0cee5169e6c6), UINT64_C(0x2fe9e08be37fd90a), UINT64_C(0xc18d48b6c89c88c3),
	UINT64_C(0x5b0af6146dfd0a2e), UINT64_C(0x9b7101cc77159afd), UINT64_C(0x4352294329ac32e8),
	UINT64_C(0x88dd699712e30ef8), UINT64_C(0x85768e019507ab6f), UINT64_C(0x17f33b92d04c6b32),
	UINT64_C(0xb27b10ec34052b9d), UINT64_C(0xf2671ff4987d31ed), UINT64_C(0x1295785f2d5dc0ab),
	UINT64_C(0x41b4eb131d854adf), UINT64_C(0x2f86867bba9888e2), UINT64_C(0x20d2a38140ccf276),
	UINT64_C(0x024e86e073f38739), UINT64_C(0x87ad107c11a9c9f9), UINT64_C(0xc874f411c106b078),
	UINT64_C(0x49935da23623aa20), UINT64_C(0x4297318910a9a06a), UINT64_C(0xcdebad99dd5816f0),
	UINT64_C(0x5f8474b725bf97cf), UINT64_C(0xc6cc7d619c9dcd46), UINT64_C(0x5b82e212029328ce),
	UINT64_C(0x460409d9e9a6c80c), UINT64_C(0x08201848d134a76b), UINT64_C(0x5418d5ddfdaa7e44),
	UINT64_C(0x52bd21037302e12f), UINT64_C(0x249b01a288f5e180), UINT64_C(0x060cf1d8c27a0bfe),
	UINT64_C(0xfe8ae825eabccd29), UINT64_C(0x77ae2bb7871c6b54), UINT64_C(0x8beb4bae423f4221),
	UINT64_C(0x0f2fd6e426a86143), UINT64_C(0xa8668d96ac0676f6), UINT64_C(0x7a3a4567d3fe9eef),
	UINT64_C(0x36887ca6425c1a99), UINT64_C(0xabb17e24e62ccff3), UINT64_C(0xabce69a918a94aa0),
	UINT64_C(0xc0cbe45df4bc3fd4), UINT64_C(0xdfb5f19535f5040e), UINT64_C(0x75d5922b5dc2c89d),
	UINT64_C(0x8310a3a4f470ffd5), UINT64_C(0x4754722814171d1e), UINT64_C(0xac8b24b0956e5398),
	UINT64_C(0x4afd5258da83f455), UINT64_C(0xc1ff1cb6a5374f5f), UINT64_C(0xcf048977cc1929c7),
	UINT64_C(0x8c0068c1364ec2e1), UINT64_C(0xc2591d06255df7eb), UINT64_C(0x910cd249c0ab3cef),
	UINT64_C(0x758e76b26f1d6216), UINT64_C(0xd361819cd40c8307), UINT64_C(0x9006ff17a82c1bea),
	UINT64_C(0x75ee94c1dbe3efb0), UINT64_C(0xe64a168b62d77222), UINT64_C(0xd2b4423b83336252),
	UINT64_C(0x1d719e3cdee1a90d), UINT64_C(0x64798d2f3eb98ba1), UINT64_C(0x83363a9f56b8b8dd),
	UINT64_C(0x89ac57fb6f1dd8eb), UINT64_C(0x1ef760b94ceff215), UINT64_C(0xef4f59c76378f740),
	UINT64_C(0x5071c61b6b79ef32), UINT64_C(0xdbb763a9ca9cfb13), UINT64_C(0x60550275ce6b9de0),
	UINT64_C(0x2df61c92de4402d0), UINT64_C(0x638a4369ff9bada7), UINT64_C(0x731f6f6806c995eb),
	UINT64_C(0x80660361602ba63b), UINT64_C(0x1d8e2488a62f56c8), UINT64_C(0xb8baf944862d47f0),
	UINT64_C(0x2162219006346b65), UINT64_C(0x100d8b6a5f27de6a), UINT64_C(0xec7e37edc7e00f91),
	UINT64_C(0xa130025ac974b752), UINT64_C(0x579a8c03e7de8f89), UINT64_C(0x83db8a30cb717274),
	UINT64_C(0x04dd29affdc2e8ce), UINT64_C(0xafe9d62a20487f8d), UINT64_C(0x5e706ee10a96ac31),
	UINT64_C(0xacf8ea3784baa716), UINT64_C(0xdb17f7152484c2fe), UINT64_C(0xdeb32c5a4c4d1734),
	UINT64_C(0x7607d5483f3aa0fe), UINT64_C(0x0425c3dba2222379), UINT64_C(0x80892ebcc2e6e08e),
	UINT64_C(0xca6dd14f6d173e41), UINT64_C(0xa443bc38a40b6a40), UINT64_C(0x8fe6a87681c20404),
	UINT64_C(0x39c15d2eea889c71), UINT64_C(0xdc92468a76993e48), UINT64_C(0xa20764f252c4ce2a),
	UINT64_C(0x9bd7c368a0614b7f), UINT64_C(0x4ccd9257fd653657), UINT64_C(0x0c8fc62d3ea035e7),
	UINT64_C(0x62a43d9197467d02), UINT64_C(0x0f1dbc0b2622147b), UINT64_C(0xb9cd5d400834b13b),
	UINT64_C(0x35bad8a6d135427e), UINT64_C(0xc6d2fa770456b2c6), UINT64_C(0x572201e9e505fca4),
	UINT64_C(0x2d180a20e0811eb5), UINT64_C(0x1ecb8be89a422c77), UINT64_C(0xd0a7640b4da78da8),
	UINT64_C(0x0d684439e340b055), UINT64_C(0xf4df5bd91a8d79ac), UINT64_C(0x319591a4704b2640),
	UINT64_C(0x77744a9cd257808d), UINT64_C(0xeb9ab4d2e58d03a1), UINT64_C(0xffb25427a32befaa),
	UINT64_C(0xa758c9a2ede7ee8b), UINT64_C(0xf9d8a1eb7f67f97f), UINT64_C(0x948c97fead76d6dd),
	UINT64_C(0xbde635b64a746316), UINT64_C(0x920c7b8453ddaaf1), UINT64_C(0x20ba4e2bd7a95252),
	UINT64_C(0x15fd5c58bed6c623), UINT64_C(0xea6c1b572740c143), UINT64_C(0x80e02cdd2b8fc9ee),
	UINT64_C(0xe8cdb2185b4c46a6), UINT64_C(0x7864ecc4dde319d8), UINT64_C(0x4790d15dc6252e61),
	UINT64_C(0x8c6c7c67f2ed4e08), UINT64_C(0x4b5d1546a70cbf04), UINT64_C(0xc8a9f404aafa6866),
	UINT64_C(0x5dd65cc298363512), UINT64_C(0x8958a8d031ab2a94), UINT64_C(0x4915b0737b5b80e7),
	UINT64_C(0x7518936f13c0f72a), UINT64_C(0x156437cdf5335dc4), UINT64_C(0x1cc1066bfcd104f3),
	UINT64_C(0x18cc06bdde227100), UINT64_C(0x7d79dc7facfabee5), UINT64_C(0xa95ada0c3666e7aa),
	UINT64_C(0x12e7680d6cf20df2), UINT64_C(0xbf67d93233ec43a8), UINT64_C(0x8775d68a817cd6ba),
	UINT64_C(0x3aaf8e9946e3d6c6), UINT64_C(0x0802cc95b5cb45a3), UINT64_C(0xf1b917bdd547be27),
	UINT64_C(0xb47b71c88f6b2dc0), UINT64_C(0x1e7d44efb5be40f7), UINT64_C(0x6e9f724354639864),
	UINT64_C(0x1a764b359f52b068), UINT64_C(0xd252433df7169760), UINT64_C(0xfbc1b52a9bd5807c),
	UINT64_C(0x4098f6289d10dbcc), UINT64_C(0xb4aa768716b9cf41), UINT64_C(0x5c229eb687006265),
	UINT64_C(0x815d73b097e37245), UINT64_C(0x698c6f4dc21c79c2), UINT64_C(0x1e1c25e5937cc944),
	UINT64_C(0x46806db768649234), UINT64_C(0xd3016032536a171d), UINT64_C(0x008f0823a64f46c3),
	UINT64_C(0x46a518e5b854d29f), UINT64_C(0x8a546c1dabd3428e), UINT64_C(0x3d224a9bbe19a61b),
	UINT64_C(0x4c451200c2a6b2c7), UINT64_C(0xcbe740e3766652bf), UINT64_C(0x7afe6e10bb458839),
	UINT64_C(0xbb15a2ca03cf977f), UINT64_C(0x1f0b43d3b67190ea), UINT64_C(0xf04aad128681436e),
	UINT64_C(0x568ec25e263e42c7), UINT64_C(0xa56e5a317669ea0e), UINT64_C(0xb0c9f7c585432723),
	UINT64_C(0x52520d8fc3f3e9ba), UINT64_C(0xbfadbb259cceef50), UINT64_C(0x91cb9442f5da658f),
	UINT64_C(0x85d2b2a0e345f30c), UINT64_C(0x4dc1d415c804195f), UINT64_C(0x63374ff36ae3cd69),
	UINT64_C(0xd2ce4403864243cd), UINT64_C(0x3609735b5036d604), UINT64_C(0x9fcc35413b24c774),
	UINT64_C(0xf034a1bf9cd008ea), UINT64_C(0x0b664e551dce5c18), UINT64_C(0x1a4e160eb144fd94),
	UINT64_C(0xf75f6ccfa2e24e41), UINT64_C(0x177f71aa10de8fd8), UINT64_C(0x78fef6f4a8b1719a),
	UINT64_C(0x1553e85c4dbabb8f), UINT64_C(0x04758d9d50cead3d), UINT64_C(0x7c72bbe6842d1e29),
	UINT64_C(0xf6c99766c2f03dc6), UINT64_C(0x7d3fc0fd9b96601f), UINT64_C(0x384035ef0c6c94f7),
	UINT64_C(0x447c67699f811420), UINT64_C(0x5d0c7556f937c600), UINT64_C(0x7547a88fe6fe61e8),
	UINT64_C(0xb4ef86f2234b50f1),
};

int ckpt_cdc_params_check(const struct ckpt_cdc_params *p)
{
	if (!p)
		return -EINVAL;
	if (p->min_size < CKPT_CDC_MIN_MIN || p->min_size >= p->avg_size ||
	    p->avg_size >= p->max_size || p->max_size > CKPT_CDC_MAX_MAX)
		return -EINVAL;
	if (p->avg_size & (p->avg_size - 1))
		return -EINVAL;
	return 0;
}

/* n one-bits ending at bit 62 (bit 63 stays clear). */
static inline uint64_t cdc_mask(unsigned n)
{
	return ((UINT64_C(1) << n) - 1) << (63 - n);
}

/*
 * The gear loop.  The hash at a position depends only on the last 64 bytes
 * (older terms are shifted out), so a block of CDC_LANES * CDC_LANE_LEN
 * bytes is scanned as CDC_LANES independent lanes interleaved: lane 0
 * continues the running hash, lane j > 0 starts from 0 at 64 bytes before
 * its first position and has the exact hash from there on.  The lanes only
 * tell whether the block holds a cut; where one does, the block is scanned
 * again one byte at a time from its start (cuts are rare: about one per
 * 2^17 to 2^21 positions), so the first cut is found exactly as by the
 * one-lane loop.  Independent lanes let the CPU overlap what the one-lane
 * loop does in sequence (each step waits for the previous hash).
 */
#define CDC_WINDOW 64
#define CDC_LANES 4
#define CDC_LANE_LEN 4096 /* >= CDC_WINDOW */

/* One byte at a time: index + 1 of the first position of p[0..n) whose
 * hash (h before p[0], updated in *ph) has no bit of m set, or 0. */
static size_t scan_one(const uint8_t *p, size_t n, uint64_t m, uint64_t *ph)
{
	uint64_t h = *ph;

	for (size_t i = 0; i < n; i++) {
		h = (h << 1) + gear[p[i]];
		if (!(h & m)) {
			*ph = h;
			return i + 1;
		}
	}
	*ph = h;
	return 0;
}

/* scan_one()'s result, with whole blocks tested by the lanes first. */
static size_t scan(const uint8_t *p, size_t n, uint64_t m, uint64_t *ph)
{
	size_t at = 0;

	while (n - at >= CDC_LANES * CDC_LANE_LEN) {
		const uint8_t *p0 = p + at, *p1 = p0 + CDC_LANE_LEN, *p2 = p1 + CDC_LANE_LEN,
			      *p3 = p2 + CDC_LANE_LEN;
		uint64_t h0 = *ph, h1 = 0, h2 = 0, h3 = 0, any = 0;

		for (size_t k = CDC_WINDOW; k > 0; k--) {
			h1 = (h1 << 1) + gear[p1[-(ptrdiff_t)k]];
			h2 = (h2 << 1) + gear[p2[-(ptrdiff_t)k]];
			h3 = (h3 << 1) + gear[p3[-(ptrdiff_t)k]];
		}
		for (size_t t = 0; t < CDC_LANE_LEN; t++) {
			h0 = (h0 << 1) + gear[p0[t]];
			h1 = (h1 << 1) + gear[p1[t]];
			h2 = (h2 << 1) + gear[p2[t]];
			h3 = (h3 << 1) + gear[p3[t]];
			/* a zero test per lane, one branch per step */
			any = (uint64_t)!(h0 & m) | (uint64_t)!(h1 & m) | (uint64_t)!(h2 & m) |
			      (uint64_t)!(h3 & m);
			if (__builtin_expect(any != 0, 0))
				break;
		}
		if (any) {
			/* a cut in this block: find the first one */
			size_t r = scan_one(p0, CDC_LANES * CDC_LANE_LEN, m, ph);
			return r ? at + r : 0; /* r == 0 cannot happen: a lane saw a cut */
		}
		*ph = h3;
		at += CDC_LANES * CDC_LANE_LEN;
	}
	{
		size_t r = scan_one(p + at, n - at, m, ph);
		return r ? at + r : 0;
	}
}

size_t ckpt_cdc_cut(const struct ckpt_cdc_params *p, const uint8_t *buf, size_t len, bool eof)
{
	size_t scanned = 0;

	return ckpt_cdc_cut_resume(p, buf, len, eof, &scanned);
}

/*
 * Resuming: the hash at position i is the sum of gear[buf[k]] << (i - k)
 * over k = min_size..i, mod 2^64, so terms older than 64 bytes have been
 * shifted out.  Restarting with h = 0 at from = *scanned - 64 (when that is
 * past min_size) and feeding the bytes up to *scanned without testing gives
 * exactly the hash the full scan had there; positions below *scanned had
 * no cut, so testing starts at *scanned.
 */
size_t ckpt_cdc_cut_resume(const struct ckpt_cdc_params *p, const uint8_t *buf, size_t len,
			   bool eof, size_t *scanned)
{
	uint64_t h = 0, mask_s, mask_l;
	size_t end, normal, i, from, r;
	unsigned bits;

	if (ckpt_cdc_params_check(p) || !buf || !len || !scanned)
		return 0;
	end = CKPT_MIN(len, p->max_size);
	if (end > p->min_size) {
		bits = (unsigned)__builtin_ctzll((unsigned long long)p->avg_size);
		mask_s = cdc_mask(bits + 2);
		mask_l = cdc_mask(bits - 2);
		normal = CKPT_MIN(p->avg_size, end);
		i = p->min_size;
		from = CKPT_MIN(*scanned, end);
		if (from > p->min_size + CDC_WINDOW)
			i = from - CDC_WINDOW;
		for (; i < from && i < end; i++)
			h = (h << 1) + gear[buf[i]];
		i = CKPT_MAX(i, p->min_size);
		if (i < normal) {
			r = scan(buf + i, normal - i, mask_s, &h);
			if (r) {
				*scanned = 0;
				return i + r;
			}
			i = normal;
		}
		if (i < end) {
			r = scan(buf + i, end - i, mask_l, &h);
			if (r) {
				*scanned = 0;
				return i + r;
			}
		}
	}
	*scanned = end;
	if (len >= p->max_size) {
		*scanned = 0;
		return p->max_size;
	}
	if (eof) {
		*scanned = 0;
		return len;
	}
	return 0;
}

size_t ckpt_cdc_feed(const struct ckpt_cdc_params *p, struct ckpt_cdc_state *st, const uint8_t *buf,
		     size_t n)
{
	size_t pos = st->seen, k = 0, cnt, r;
	unsigned bits = (unsigned)__builtin_ctzll((unsigned long long)p->avg_size);
	uint64_t h = st->h;

	if (pos < p->min_size) {
		cnt = CKPT_MIN(p->min_size - pos, n);
		pos += cnt;
		k += cnt;
	}
	if (k < n && pos < p->avg_size) {
		cnt = CKPT_MIN(p->avg_size - pos, n - k);
		r = scan(buf + k, cnt, cdc_mask(bits + 2), &h);
		if (r)
			goto cut;
		pos += cnt;
		k += cnt;
	}
	if (k < n && pos < p->max_size) {
		cnt = CKPT_MIN(p->max_size - pos, n - k);
		r = scan(buf + k, cnt, cdc_mask(bits - 2), &h);
		if (r)
			goto cut;
		pos += cnt;
		k += cnt;
	}
	if (pos == p->max_size && k > 0) {
		r = 0; /* forced cut after buf[k - 1] */
		goto cut;
	}
	st->seen = pos;
	st->h = h;
	return 0;
cut:
	st->seen = 0;
	st->h = 0;
	return k + r;
}
