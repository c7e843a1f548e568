/* SPDX-License-Identifier: MIT */
/*
 * check_vcache.c - unit tests for core/views/vcache.[ch]: the
 * reference-counted caches of parsed sources and view models.
 *
 * The cache never looks inside a store, so the stores here are two
 * distinct addresses.
 */
#include <check.h>
#include <stdlib.h>

#include "views/vcache.h"
#include "testlib.h"

struct entry {
	struct vcache_node node;
	int key;
};

static int destroyed[16];
static int ndestroyed;

static void entry_destroy(struct vcache_node *n)
{
	struct entry *e = vcache_entry(n, struct entry);

	ck_assert_int_lt(ndestroyed, 16);
	destroyed[ndestroyed++] = e->key;
	free(e);
}

static struct vcache cache = VCACHE_INIT(3, entry_destroy, 0);
static char store_a, store_b;
#define SA ((ckpt_store *)(void *)&store_a)
#define SB ((ckpt_store *)(void *)&store_b)

static bool key_match(const struct vcache_node *n, const void *key)
{
	return vcache_entry(n, const struct entry)->key == *(const int *)key;
}

static struct entry *entry_add_sized(int key, ckpt_store *s, size_t bytes)
{
	struct entry *e = calloc(1, sizeof(*e));

	ck_assert_ptr_nonnull(e);
	e->key = key;
	e->node.bytes = bytes;
	vcache_insert(&cache, &e->node, s);
	return e;
}

static struct entry *entry_add(int key, ckpt_store *s)
{
	struct entry *e = calloc(1, sizeof(*e));

	ck_assert_ptr_nonnull(e);
	e->key = key;
	vcache_insert(&cache, &e->node, s);
	return e;
}

static struct entry *find(int key)
{
	struct vcache_node *n = vcache_find(&cache, key_match, &key);

	return n ? vcache_entry(n, struct entry) : NULL;
}

static void setup(void)
{
	ndestroyed = 0;
}

static void teardown(void)
{
	vcache_forget_store(&cache, SA);
	vcache_forget_store(&cache, SB);
	ck_assert_ptr_null(cache.head);
}

/* A user's reference keeps an entry alive after the cache lets it go; the
 * cache keeps its `keep` newest entries alive after their users let go. */
START_TEST(test_refs_and_keep)
{
	struct entry *e[5];

	for (int i = 0; i < 5; i++)
		e[i] = entry_add(i, SA);
	/* past keep: the cache let go of 0 and 1, which are still found
	 * (shared) while their users hold them */
	ck_assert_int_eq(ndestroyed, 0);
	ck_assert_ptr_eq(find(0), e[0]);
	vcache_unref(&cache, &e[0]->node); /* find's reference */
	vcache_unref(&cache, &e[0]->node); /* the user's: the last */
	ck_assert_int_eq(ndestroyed, 1);
	ck_assert_int_eq(destroyed[0], 0);
	ck_assert_ptr_null(find(0));
	for (int i = 1; i < 5; i++)
		vcache_unref(&cache, &e[i]->node);
	ck_assert_int_eq(ndestroyed, 2);
	ck_assert_int_eq(destroyed[1], 1);
	/* 2, 3, 4 are kept with no user */
	ck_assert_ptr_eq(find(4), e[4]);
	vcache_unref(&cache, &e[4]->node);
	vcache_unref(&cache, NULL);
	ck_assert_int_eq(ndestroyed, 2);
}
END_TEST

/* Newest first: a second entry with the same key hides the first. */
START_TEST(test_newest_first)
{
	struct entry *a = entry_add(7, SA), *b = entry_add(7, SA);

	ck_assert_ptr_eq(find(7), b);
	vcache_unref(&cache, &b->node);
	vcache_unref(&cache, &a->node);
	vcache_unref(&cache, &b->node);
	ck_assert_int_eq(ndestroyed, 0);
}
END_TEST

/* Forgetting a store releases the cache's holds on its entries only;
 * entries still in use stay valid until their users let go. */
START_TEST(test_forget_store)
{
	struct entry *a = entry_add(1, SA), *b = entry_add(2, SB), *c = entry_add(3, SA);

	vcache_unref(&cache, &a->node);
	vcache_forget_store(&cache, SA);
	ck_assert_int_eq(ndestroyed, 1);
	ck_assert_int_eq(destroyed[0], 1);
	ck_assert_ptr_null(find(1));
	ck_assert_ptr_eq(find(3), c); /* in use: still shared */
	vcache_unref(&cache, &c->node);
	ck_assert_ptr_eq(find(2), b);
	vcache_unref(&cache, &b->node);
	vcache_unref(&cache, &c->node);
	ck_assert_int_eq(ndestroyed, 2);
	vcache_unref(&cache, &b->node);
	ck_assert_int_eq(ndestroyed, 2); /* still kept */
	vcache_forget_store(&cache, SB);
	ck_assert_int_eq(ndestroyed, 3);
}
END_TEST

/* An entry never inserted (one reference) goes on its only unref. */
START_TEST(test_not_inserted)
{
	struct entry *e = calloc(1, sizeof(*e));

	ck_assert_ptr_nonnull(e);
	e->key = 9;
	e->node.refs = 1;
	vcache_unref(&cache, &e->node);
	ck_assert_int_eq(ndestroyed, 1);
	ck_assert_int_eq(destroyed[0], 9);
}
END_TEST

/* The keys dead_key() calls dead, and how often it was asked. */
static bool dead_keys[16];
static int dead_calls;

static bool dead_key(const struct vcache_node *n)
{
	int key = vcache_entry(n, const struct entry)->key;

	dead_calls++;
	/* asked without the cache's lock: the cache can be used meanwhile */
	vcache_unref(&cache, vcache_find(&cache, key_match, &key));
	return dead_keys[key];
}

/* A sweep lets go of the kept entries it is told are dead, at once rather
 * than when they are the oldest; live ones stay kept, and a dead entry
 * still in use stays valid (and shared, as any entry the cache let go of)
 * until its user lets go. */
START_TEST(test_sweep)
{
	struct entry *e[3];

	for (int i = 0; i < 3; i++) {
		e[i] = entry_add(i, SA);
		if (i != 1)
			vcache_unref(&cache, &e[i]->node); /* kept only */
	}
	dead_keys[0] = dead_keys[1] = true;
	dead_calls = 0;
	vcache_sweep(&cache, dead_key);
	ck_assert_int_eq(dead_calls, 3);
	/* 0: no user, gone; 1: in use, valid; 2: kept */
	ck_assert_int_eq(ndestroyed, 1);
	ck_assert_int_eq(destroyed[0], 0);
	ck_assert_ptr_null(find(0));
	ck_assert_ptr_eq(find(1), e[1]);
	vcache_unref(&cache, &e[1]->node);
	ck_assert_ptr_eq(find(2), e[2]);
	vcache_unref(&cache, &e[2]->node);
	/* a second sweep asks about the kept entries only */
	dead_calls = 0;
	vcache_sweep(&cache, dead_key);
	ck_assert_int_eq(dead_calls, 1);
	vcache_unref(&cache, &e[1]->node);
	ck_assert_int_eq(ndestroyed, 2);
	ck_assert_int_eq(destroyed[1], 1);
	dead_keys[0] = dead_keys[1] = false;
}
END_TEST

/* The byte budget: kept entries whose bytes, with those of the newer kept
 * ones, pass it are let go of, oldest first; the newest stays whatever its
 * size; entries in use stay alive (and do not count); lowering the budget
 * trims at once. */
START_TEST(test_byte_budget)
{
	struct entry *e[4];

	vcache_set_budget(&cache, 100);
	e[0] = entry_add_sized(0, SA, 40);
	e[1] = entry_add_sized(1, SA, 40);
	ck_assert_uint_eq(vcache_kept_bytes(&cache), 80);
	for (int i = 0; i < 2; i++)
		vcache_unref(&cache, &e[i]->node);
	ck_assert_int_eq(ndestroyed, 0);
	/* 30 + 40 + 40 > 100: the oldest (0) goes */
	e[2] = entry_add_sized(2, SA, 30);
	vcache_unref(&cache, &e[2]->node);
	ck_assert_int_eq(ndestroyed, 1);
	ck_assert_int_eq(destroyed[0], 0);
	ck_assert_uint_eq(vcache_kept_bytes(&cache), 70);
	/* one entry past the budget alone: kept, every older one goes, but
	 * a user's reference keeps 1 alive (found, not kept) */
	ck_assert_ptr_eq(find(1), e[1]);
	e[3] = entry_add_sized(3, SA, 500);
	ck_assert_uint_eq(vcache_kept_bytes(&cache), 500);
	ck_assert_int_eq(ndestroyed, 2);
	ck_assert_int_eq(destroyed[1], 2);
	ck_assert_ptr_eq(find(1), e[1]);
	vcache_unref(&cache, &e[1]->node);
	vcache_unref(&cache, &e[1]->node);
	ck_assert_int_eq(ndestroyed, 3);
	ck_assert_int_eq(destroyed[2], 1);
	ck_assert_uint_eq(vcache_count(&cache), 1);
	vcache_unref(&cache, &e[3]->node);
	/* no budget: counts only */
	vcache_set_budget(&cache, 0);
	for (int i = 0; i < 3; i++)
		vcache_unref(&cache, &entry_add_sized(10 + i, SA, 1000)->node);
	ck_assert_uint_eq(vcache_count(&cache), 3);
	/* a lower budget trims now: only the newest stays */
	vcache_set_budget(&cache, 1500);
	ck_assert_uint_eq(vcache_count(&cache), 1);
	ck_assert_ptr_null(find(10));
	vcache_set_budget(&cache, 0);
}
END_TEST

static Suite *vcache_suite(void)
{
	Suite *s = suite_create("vcache");
	TCase *tc = tcase_create("cache");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_refs_and_keep);
	tcase_add_test(tc, test_newest_first);
	tcase_add_test(tc, test_forget_store);
	tcase_add_test(tc, test_not_inserted);
	tcase_add_test(tc, test_sweep);
	tcase_add_test(tc, test_byte_budget);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return tl_run(vcache_suite());
}
