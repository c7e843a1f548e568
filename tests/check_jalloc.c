/* SPDX-License-Identifier: MIT */
/*
 * check_jalloc.c - unit tests for core/base/jalloc.c, the scoped arena
 * allocator under jansson: what jalloc.h promises, one test each.
 *
 * Test-only instrumentation: this suite is linked with --wrap=malloc and
 * --wrap=free (Makefile.am), so every malloc and free of the objects linked
 * in (jalloc.c, this file, testlib; not those inside libc or jansson) goes
 * through the __wrap_ functions below.  They count the
 * calls per thread, keep the set of live allocations of at least one
 * arena block (CKPT_JSON_BLOCK bytes: the arena's blocks, as nothing else
 * here allocates that much), and fail allocations when a test asks.
 * Check itself is linked statically and allocates in every assertion, so
 * calls are counted, and failures injected, only inside COUNTED(), which
 * holds no assertion.  Each test runs in its own forked process (Check's
 * default).
 */
#include <check.h>
#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/jalloc.h"
#include "base/util.h"
#include "testlib.h"

/* In a sanitizer build (configure --enable-sanitizers): test_size_overflow asks malloc for
 * SIZE_MAX - 15 bytes on purpose and expects NULL, as glibc's malloc returns; AddressSanitizer
 * would stop the test instead.  Its options from ASAN_OPTIONS still apply on top of this. */
const char *__asan_default_options(void);
const char *__asan_default_options(void)
{
	return "allocator_may_return_null=1";
}

/* ---- wrapped malloc and free ------------------------------------------- */

void *__real_malloc(size_t n);
void __real_free(void *p);
void *__wrap_malloc(size_t n);
void __wrap_free(void *p);

static _Thread_local struct {
	bool on;             /* inside COUNTED() */
	long mallocs, frees; /* calls of this thread while on, big ones included */
} calls;

/* Run stmt with this thread's calls counted (and failed if asked). */
#define COUNTED(stmt)              \
	do {                       \
		calls.on = true;   \
		stmt;              \
		calls.on = false;  \
	} while (0)

static atomic_int fail_mallocs; /* the next this many counted mallocs fail */

/* The live allocations >= CKPT_JSON_BLOCK, guarded by big_lock. */
#define MAX_BIG 1024
static pthread_mutex_t big_lock = PTHREAD_MUTEX_INITIALIZER;
static void *big[MAX_BIG];
static size_t big_size[MAX_BIG];
static int nbig;
static long big_made; /* since the process started */

void *__wrap_malloc(size_t n)
{
	void *p;
	int f = calls.on ? atomic_load(&fail_mallocs) : 0;

	while (f > 0 && !atomic_compare_exchange_weak(&fail_mallocs, &f, f - 1))
		;
	if (f > 0) {
		errno = ENOMEM;
		return NULL;
	}
	p = __real_malloc(n);
	calls.mallocs += calls.on;
	if (p && n >= CKPT_JSON_BLOCK) {
		pthread_mutex_lock(&big_lock);
		if (nbig == MAX_BIG) {
			/* no assertion here (see above); the test dies instead */
			fprintf(stderr, "check_jalloc: more than %d blocks live\n", MAX_BIG);
			abort();
		}
		big[nbig] = p;
		big_size[nbig++] = n;
		big_made++;
		pthread_mutex_unlock(&big_lock);
	}
	return p;
}

void __wrap_free(void *p)
{
	if (!p)
		return;
	calls.frees += calls.on;
	pthread_mutex_lock(&big_lock);
	for (int i = 0; i < nbig; i++)
		if (big[i] == p) {
			big[i] = big[--nbig];
			big_size[i] = big_size[nbig];
			break;
		}
	pthread_mutex_unlock(&big_lock);
	__real_free(p);
}

/* The live allocations >= CKPT_JSON_BLOCK now. */
struct big_now {
	int live;     /* how many */
	size_t bytes; /* their bytes */
	long made;    /* made since the process started */
};

static struct big_now big_now(void)
{
	struct big_now r = { 0, 0, 0 };

	pthread_mutex_lock(&big_lock);
	r.live = nbig;
	for (int i = 0; i < nbig; i++)
		r.bytes += big_size[i];
	r.made = big_made;
	pthread_mutex_unlock(&big_lock);
	return r;
}

/* jansson's allocation functions, as installed. */
static json_malloc_t jm;
static json_free_t jf;

static void setup(void)
{
	json_get_alloc_funcs(&jm, &jf);
	ck_assert_ptr_nonnull(jm);
	ck_assert_ptr_nonnull(jf);
}

/* A safetensors-like header of n tensors, as text (malloc'd). */
static char *header_text(int n)
{
	size_t cap = (size_t)n * 128 + 64, len = 0;
	char *s = __real_malloc(cap); /* not counted: it may be as large as a block */

	ck_assert_ptr_nonnull(s);
	len += (size_t)snprintf(s + len, cap - len, "{\"__metadata__\": {\"format\": \"pt\"}");
	for (int i = 0; i < n; i++)
		len += (size_t)snprintf(s + len, cap - len,
					",\"model.layers.%d.weight\": {\"dtype\": \"BF16\", "
					"\"shape\": [%d, 64], \"data_offsets\": [%d, %d]}",
					i, i + 1, i * 128, i * 128 + 128);
	snprintf(s + len, cap - len, "}");
	return s;
}

/* The parsed header h has the n tensors of header_text(n). */
static void check_header(json_t *h, int n)
{
	ck_assert_ptr_nonnull(h);
	ck_assert_uint_eq(json_object_size(h), (size_t)n + 1);
	for (int i = 0; i < n; i += 997) {
		char key[64];
		json_t *t, *shape;

		snprintf(key, sizeof(key), "model.layers.%d.weight", i);
		t = json_object_get(h, key);
		ck_assert_ptr_nonnull(t);
		ck_assert_str_eq(json_string_value(json_object_get(t, "dtype")), "BF16");
		shape = json_object_get(t, "shape");
		ck_assert_int_eq(json_integer_value(json_array_get(shape, 0)), i + 1);
		ck_assert_int_eq(json_integer_value(
					 json_array_get(json_object_get(t, "data_offsets"), 1)),
				 i * 128 + 128);
	}
}

/* ---- installation, outside a scope ------------------------------------ */

START_TEST(test_installed_before_main)
{
	json_t *v;

	/* main() did not call anything: the functions are ours already */
	ck_assert_ptr_ne((void *)jm, (void *)__real_malloc);
	ck_assert_ptr_ne((void *)jm, (void *)__wrap_malloc);
	ck_assert_ptr_ne((void *)jf, (void *)__wrap_free);
	/* outside a scope every jansson allocation is a malloc, freed by decref */
	COUNTED(v = json_pack("{s:s, s:[i,i]}", "name", "w", "shape", 3, 4));
	ck_assert_ptr_nonnull(v);
	ck_assert_int_gt(calls.mallocs, 3);
	ck_assert_int_eq(calls.frees, 0);
	COUNTED(json_decref(v));
	ck_assert_int_eq(calls.frees, calls.mallocs);
	ck_assert_int_eq(big_now().live, 0);
}
END_TEST

/* ---- inside a scope --------------------------------------------------- */

START_TEST(test_scope_parse_arena)
{
	char *text = header_text(20000);
	json_error_t e;
	long blocks;
	json_t *h;

	COUNTED(ckpt_json_scope_begin(); h = json_loads(text, 0, &e));
	ck_assert_msg(h != NULL, "parse: %s", e.text);
	check_header(h, 20000);
	/* no malloc per object: only arena blocks were allocated */
	blocks = calls.mallocs;
	ck_assert_int_gt(blocks, CKPT_JSON_KEEP_BLOCKS);
	ck_assert_int_eq(big_now().live, blocks);
	ck_assert_int_eq(big_now().made, blocks);
	/* frees inside the scope are no-ops */
	COUNTED(json_decref(h));
	ck_assert_int_eq(calls.frees, 0);
	ck_assert_int_eq(big_now().live, blocks);
	COUNTED(ckpt_json_scope_end());
	/* released at the end: CKPT_JSON_KEEP_BLOCKS stay with the thread */
	ck_assert_int_eq(big_now().live, CKPT_JSON_KEEP_BLOCKS);
	ck_assert_int_eq(calls.frees, blocks - CKPT_JSON_KEEP_BLOCKS);
	/* and serve the next parse */
	COUNTED(ckpt_json_scope_begin(); h = json_loads(text, 0, &e));
	check_header(h, 20000);
	ck_assert_int_eq(calls.mallocs, blocks + blocks - CKPT_JSON_KEEP_BLOCKS);
	ckpt_json_scope_end();
	__real_free(text);
}
END_TEST

START_TEST(test_spare_blocks)
{
	/* an allocation of this size fills one block exactly */
	const size_t whole = CKPT_JSON_BLOCK - 16;
	const int n = CKPT_JSON_KEEP_BLOCKS + 4;
	void *first[CKPT_JSON_KEEP_BLOCKS + 4];
	long made;

	ckpt_json_scope_begin();
	for (int i = 0; i < n; i++) {
		first[i] = jm(whole);
		ck_assert_ptr_nonnull(first[i]);
		memset(first[i], i, whole);
	}
	ck_assert_int_eq(big_now().made, n);
	ckpt_json_scope_end();
	ck_assert_int_eq(big_now().live, CKPT_JSON_KEEP_BLOCKS);

	/* the next scope takes the spare blocks before it makes new ones */
	made = big_now().made;
	ckpt_json_scope_begin();
	for (int i = 0; i < CKPT_JSON_KEEP_BLOCKS; i++) {
		void *p = jm(whole);
		bool reused = false;

		ck_assert_ptr_nonnull(p);
		for (int j = 0; j < n; j++)
			reused |= p == first[j];
		ck_assert_msg(reused, "allocation %d is not in a retained block", i);
	}
	ck_assert_int_eq(big_now().made, made);
	ck_assert_ptr_nonnull(jm(100));
	ck_assert_int_eq(big_now().made, made + 1);
	/* an allocation larger than a block gets a block of its own, which is
	 * not retained */
	ck_assert_ptr_nonnull(jm(3 * CKPT_JSON_BLOCK));
	ck_assert_int_eq(big_now().made, made + 2);
	ckpt_json_scope_end();
	ck_assert_int_eq(big_now().live, CKPT_JSON_KEEP_BLOCKS);
	/* only whole blocks are kept: the large one was freed */
	ck_assert_uint_lt(big_now().bytes, (size_t)CKPT_JSON_KEEP_BLOCKS * (CKPT_JSON_BLOCK + 4096));
}
END_TEST

START_TEST(test_small_allocations_share_a_block)
{
	uint8_t *p[1000];
	size_t len[1000];

	ckpt_json_scope_begin();
	for (int i = 0; i < 1000; i++) {
		len[i] = (size_t)(i % 97) + 1;
		p[i] = jm(len[i]);
		ck_assert_ptr_nonnull(p[i]);
		/* aligned for any object */
		ck_assert_uint_eq((uintptr_t)p[i] % 16, 0);
		memset(p[i], (int)(i & 0xff), len[i]);
	}
	ck_assert_int_eq(big_now().made, 1);
	/* no two allocations overlap */
	for (int i = 0; i < 1000; i++)
		for (size_t k = 0; k < len[i]; k++)
			ck_assert_msg(p[i][k] == (uint8_t)(i & 0xff), "allocation %d overwritten", i);
	ckpt_json_scope_end();

	/* outside a scope too */
	for (int i = 0; i < 100; i++) {
		uint8_t *q = jm((size_t)i + 1);

		ck_assert_ptr_nonnull(q);
		ck_assert_uint_eq((uintptr_t)q % 16, 0);
		memset(q, 0xab, (size_t)i + 1);
		jf(q);
	}
	jf(NULL);
}
END_TEST

START_TEST(test_nested_scopes)
{
	json_t *outer, *inner, *later;

	ckpt_json_scope_begin();
	outer = json_pack("{s:s, s:i}", "name", "outer", "n", 7);
	ck_assert_ptr_nonnull(outer);
	ckpt_json_scope_begin();
	inner = json_string("inner");
	ck_assert_ptr_nonnull(inner);
	COUNTED(ckpt_json_scope_end());
	/* the inner end released nothing: the outer scope's values live */
	ck_assert_int_eq(calls.frees, 0);
	ck_assert_int_eq(big_now().live, 1);
	ck_assert_str_eq(json_string_value(json_object_get(outer, "name")), "outer");
	ck_assert_int_eq(json_integer_value(json_object_get(outer, "n")), 7);
	ck_assert_str_eq(json_string_value(inner), "inner");
	/* and the outer scope still allocates from the arena */
	COUNTED(later = json_string("later"));
	ck_assert_ptr_nonnull(later);
	ck_assert_str_eq(json_string_value(later), "later");
	ck_assert_int_eq(calls.mallocs, 0);
	/* which did not reuse the memory of the values still alive */
	for (int i = 0; i < 100; i++)
		ck_assert_ptr_nonnull(json_pack("{s:s}", "filler", "0123456789abcdef"));
	ck_assert_str_eq(json_string_value(json_object_get(outer, "name")), "outer");
	ck_assert_int_eq(json_integer_value(json_object_get(outer, "n")), 7);
	ck_assert_str_eq(json_string_value(inner), "inner");
	ck_assert_str_eq(json_string_value(later), "later");
	ck_assert_int_eq(big_now().made, 1);
	COUNTED(ckpt_json_scope_end());
	/* the block is kept for the next scope, not freed */
	ck_assert_int_eq(calls.frees, 0);
	ck_assert_int_eq(big_now().live, 1);
}
END_TEST

START_TEST(test_malloc_values_freed_inside_scope)
{
	json_t *v = json_string("made outside");

	ck_assert_ptr_nonnull(v);
	ckpt_json_scope_begin();
	COUNTED(json_decref(v)); /* malloc'd memory goes back to malloc, scope or not */
	ck_assert_int_eq(calls.frees, 2); /* the value and its string */
	ckpt_json_scope_end();
}
END_TEST

START_TEST(test_end_without_begin)
{
	void *p;
	json_t *v;

	ckpt_json_scope_end();
	ckpt_json_scope_end();
	/* still outside a scope: malloc per allocation */
	COUNTED(v = json_string("x"));
	ck_assert_int_eq(calls.mallocs, 2);
	json_decref(v);
	/* and one begin enters a scope again (the depth did not go negative) */
	ckpt_json_scope_begin();
	ck_assert_ptr_nonnull(jm(10));
	calls.mallocs = 0;
	COUNTED(p = jm(10));
	ck_assert_ptr_nonnull(p);
	ck_assert_int_eq(calls.mallocs, 0);
	ckpt_json_scope_end();
	COUNTED(jf(jm(10)));
	ck_assert_int_eq(calls.mallocs, 1);
	ck_assert_int_eq(calls.frees, 1);
}
END_TEST

START_TEST(test_no_memory)
{
	const char *text = "[\"a string\", 1, 2, 3]";
	json_error_t e;
	void *p, *q, *r;
	json_t *v;
	long made;

	/* outside a scope */
	atomic_store(&fail_mallocs, 1);
	COUNTED(p = jm(10); q = jm(10));
	ck_assert_ptr_null(p);
	ck_assert_ptr_nonnull(q);
	jf(q);

	/* jansson reports a block that cannot be made as an error, and
	 * recovers (no spare block yet: this thread had no scope before) */
	ckpt_json_scope_begin();
	atomic_store(&fail_mallocs, 1000);
	COUNTED(v = json_loads(text, 0, &e));
	ck_assert_ptr_null(v);
	ck_assert_int_eq(big_now().live, 0);
	atomic_store(&fail_mallocs, 0);
	COUNTED(v = json_loads(text, 0, &e));
	ck_assert_ptr_nonnull(v);
	ck_assert_str_eq(json_string_value(json_array_get(v, 0)), "a string");
	ck_assert_int_eq(big_now().live, 1);

	/* what fits the current block still works without memory */
	made = big_now().made;
	atomic_store(&fail_mallocs, 1000);
	COUNTED(p = jm(CKPT_JSON_BLOCK / 2); q = jm(CKPT_JSON_BLOCK); r = jm(100));
	atomic_store(&fail_mallocs, 0);
	ck_assert_ptr_nonnull(p);
	ck_assert_ptr_null(q);
	ck_assert_ptr_nonnull(r);
	ck_assert_int_eq(big_now().made, made);
	ck_assert_ptr_nonnull(jm(CKPT_JSON_BLOCK));
	ck_assert_int_eq(big_now().made, made + 1);
	ckpt_json_scope_end();
}
END_TEST

START_TEST(test_size_overflow)
{
	static const size_t huge[] = { SIZE_MAX, SIZE_MAX - 8, SIZE_MAX - 15, SIZE_MAX - 16,
				       SIZE_MAX - 31, SIZE_MAX / 2 + 1 };

	/* a size whose header and rounding overflow is refused, not wrapped
	 * into a small allocation */
	for (size_t i = 0; i < CKPT_ARRAY_SIZE(huge); i++)
		ck_assert_msg(jm(huge[i]) == NULL, "outside: size %zu allocated", huge[i]);
	ckpt_json_scope_begin();
	for (size_t i = 0; i < CKPT_ARRAY_SIZE(huge); i++)
		ck_assert_msg(jm(huge[i]) == NULL, "in scope: size %zu allocated", huge[i]);
	/* the arena is intact */
	ck_assert_ptr_nonnull(jm(10));
	ckpt_json_scope_end();
}
END_TEST

/* ---- threads ---------------------------------------------------------- */

struct pair {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	int step;
	long mallocs; /* of the other thread, while the main one was in its scope */
	bool ok;
};

static void pair_wait(struct pair *p, int step)
{
	pthread_mutex_lock(&p->lock);
	while (p->step < step)
		pthread_cond_wait(&p->cond, &p->lock);
	pthread_mutex_unlock(&p->lock);
}

static void pair_go(struct pair *p, int step)
{
	pthread_mutex_lock(&p->lock);
	p->step = step;
	pthread_cond_broadcast(&p->cond);
	pthread_mutex_unlock(&p->lock);
}

/* While the main thread is inside a scope, this one is not: its jansson
 * allocations are malloc'd and its values outlive the main thread's scope. */
static void *outside_main(void *arg)
{
	struct pair *p = arg;
	json_t *v;

	pair_wait(p, 1);
	COUNTED(v = json_pack("{s:s}", "who", "other thread"));
	p->mallocs = calls.mallocs;
	pair_go(p, 2);
	pair_wait(p, 3);
	p->ok = v && !strcmp(json_string_value(json_object_get(v, "who")), "other thread");
	json_decref(v);
	return NULL;
}

START_TEST(test_scope_is_per_thread)
{
	struct pair p = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, false };
	pthread_t t;
	json_t *mine, *more;

	ck_assert_int_eq(pthread_create(&t, NULL, outside_main, &p), 0);
	ckpt_json_scope_begin();
	mine = json_string("main thread");
	pair_go(&p, 1);
	pair_wait(&p, 2);
	ck_assert_int_gt(p.mallocs, 0);
	ck_assert_str_eq(json_string_value(mine), "main thread");
	COUNTED(more = json_string("more"));
	ck_assert_ptr_nonnull(more);
	ck_assert_int_eq(calls.mallocs, 0); /* still in the same block */
	ckpt_json_scope_end();
	pair_go(&p, 3);
	ck_assert_int_eq(pthread_join(t, NULL), 0);
	ck_assert(p.ok);
}
END_TEST

#define NTHREADS 4

/* Each thread parses its own header in its own scope, at the same time. */
static void *parse_main(void *arg)
{
	int n = 3000 + 1000 * (int)(intptr_t)arg;
	char *text = header_text(n);
	json_error_t e;
	json_t *h;
	bool ok = true;

	for (int round = 0; round < 3 && ok; round++) {
		ckpt_json_scope_begin();
		h = json_loads(text, 0, &e);
		ok = h && json_object_size(h) == (size_t)n + 1 &&
		     json_integer_value(json_array_get(
			     json_object_get(json_object_get(h, "model.layers.7.weight"), "shape"),
			     0)) == 8;
		ckpt_json_scope_end();
	}
	__real_free(text);
	return ok ? arg : NULL;
}

START_TEST(test_concurrent_scopes)
{
	pthread_t t[NTHREADS];

	for (intptr_t i = 0; i < NTHREADS; i++)
		ck_assert_int_eq(pthread_create(&t[i], NULL, parse_main, (void *)(i + 1)), 0);
	for (intptr_t i = 0; i < NTHREADS; i++) {
		void *r = NULL;

		ck_assert_int_eq(pthread_join(t[i], &r), 0);
		ck_assert_msg(r == (void *)(i + 1), "thread %d parsed wrong", (int)i);
	}
	/* the threads are gone, and so are their blocks */
	ck_assert_int_eq(big_now().live, 0);
}
END_TEST

/* A thread that used scopes and exits: its retained blocks go with it. */
static void *scoped_then_exit(void *arg)
{
	int nblocks = (int)(intptr_t)arg;

	ckpt_json_scope_begin();
	for (int i = 0; i < nblocks; i++)
		if (!jm(CKPT_JSON_BLOCK - 16))
			return NULL;
	ckpt_json_scope_end();
	return (void *)(intptr_t)big_now().live;
}

/* A thread that exits inside its scope (a caller's bug): its blocks go too. */
static void *exit_in_scope(void *arg)
{
	ckpt_json_scope_begin();
	ckpt_json_scope_begin();
	if (!json_pack("[s, i]", "x", 1) || !jm(2 * CKPT_JSON_BLOCK))
		return NULL;
	return arg;
}

static void *unscoped(void *arg)
{
	json_decref(json_string("x"));
	return arg;
}

START_TEST(test_thread_exit_frees_blocks)
{
	static int token;
	pthread_t t;
	void *r = NULL;

	ck_assert_int_eq(pthread_create(&t, NULL, scoped_then_exit, (void *)(intptr_t)3), 0);
	ck_assert_int_eq(pthread_join(t, &r), 0);
	ck_assert_int_eq((int)(intptr_t)r, 3); /* retained while the thread lived */
	ck_assert_int_eq(big_now().live, 0);

	ck_assert_int_eq(pthread_create(&t, NULL, scoped_then_exit,
					(void *)(intptr_t)(CKPT_JSON_KEEP_BLOCKS + 2)),
			 0);
	ck_assert_int_eq(pthread_join(t, &r), 0);
	ck_assert_int_eq((int)(intptr_t)r, CKPT_JSON_KEEP_BLOCKS);
	ck_assert_int_eq(big_now().live, 0);

	ck_assert_int_eq(pthread_create(&t, NULL, exit_in_scope, &token), 0);
	ck_assert_int_eq(pthread_join(t, &r), 0);
	ck_assert_ptr_eq(r, &token);
	ck_assert_int_eq(big_now().live, 0);

	/* a thread that never entered a scope has nothing to free */
	ck_assert_int_eq(pthread_create(&t, NULL, unscoped, NULL), 0);
	ck_assert_int_eq(pthread_join(t, NULL), 0);
	ck_assert_int_eq(big_now().live, 0);
}
END_TEST

/* libfuse's worker threads: bursts of requests start threads that parse headers in scopes,
 * and the threads beyond max_idle_threads exit once idle; the next burst starts new ones.  The
 * arena memory alive is bounded by the threads alive, however many came and went. */
#define CHURN_WAVES 6
#define CHURN_THREADS 12
#define CHURN_TENSORS 20000

struct churn {
	const char *text;
	long blocks; /* made by this thread's parse */
	bool ok;
};

static void parse_counted(struct churn *c)
{
	json_error_t e;
	json_t *h;

	calls.mallocs = 0;
	COUNTED(ckpt_json_scope_begin(); h = json_loads(c->text, 0, &e));
	c->ok = h && json_object_size(h) == CHURN_TENSORS + 1;
	c->blocks = calls.mallocs; /* only blocks: jansson allocates from the arena */
	ckpt_json_scope_end();
}

static void *churn_main(void *arg)
{
	parse_counted(arg);
	return NULL;
}

START_TEST(test_thread_churn)
{
	char *text = header_text(CHURN_TENSORS);
	struct churn c[CHURN_THREADS + 1];
	pthread_t t[CHURN_THREADS];
	long made = big_now().made;

	for (int w = 0; w < CHURN_WAVES; w++) {
		for (int i = 0; i <= CHURN_THREADS; i++)
			c[i] = (struct churn){ text, 0, false };
		for (int i = 0; i < CHURN_THREADS; i++)
			ck_assert_int_eq(pthread_create(&t[i], NULL, churn_main, &c[i]), 0);
		/* this thread is the worker that stays (an idle thread libfuse keeps) */
		parse_counted(&c[CHURN_THREADS]);
		for (int i = 0; i < CHURN_THREADS; i++)
			ck_assert_int_eq(pthread_join(t[i], NULL), 0);
		for (int i = 0; i <= CHURN_THREADS; i++) {
			ck_assert_msg(c[i].ok, "wave %d: thread %d parsed wrong", w, i);
			/* every parse took more blocks than a thread keeps: the exiting
			 * threads had both spare blocks and blocks freed at the scope's end */
			ck_assert_int_gt(c[i].blocks, CKPT_JSON_KEEP_BLOCKS);
		}
		/* the exited threads' blocks are gone; the staying thread keeps its
		 * spare ones, the same number after every wave */
		ck_assert_int_eq(big_now().live, CKPT_JSON_KEEP_BLOCKS);
		ck_assert_uint_le(big_now().bytes,
				  (size_t)CKPT_JSON_KEEP_BLOCKS * (CKPT_JSON_BLOCK + 4096));
	}
	/* and the waves did make new blocks each time (not one set reused) */
	ck_assert_int_ge(big_now().made - made,
			 (long)CHURN_WAVES * CHURN_THREADS * (CKPT_JSON_KEEP_BLOCKS + 1));
	__real_free(text);
}
END_TEST

static Suite *jalloc_suite(void)
{
	Suite *s = suite_create("jalloc");
	TCase *tc = tcase_create("core");

	tcase_add_checked_fixture(tc, setup, NULL);
	tcase_set_timeout(tc, 30);
	tcase_add_test(tc, test_installed_before_main);
	tcase_add_test(tc, test_scope_parse_arena);
	tcase_add_test(tc, test_spare_blocks);
	tcase_add_test(tc, test_small_allocations_share_a_block);
	tcase_add_test(tc, test_nested_scopes);
	tcase_add_test(tc, test_malloc_values_freed_inside_scope);
	tcase_add_test(tc, test_end_without_begin);
	tcase_add_test(tc, test_no_memory);
	tcase_add_test(tc, test_size_overflow);
	tcase_add_test(tc, test_scope_is_per_thread);
	tcase_add_test(tc, test_concurrent_scopes);
	tcase_add_test(tc, test_thread_exit_frees_blocks);
	tcase_add_test(tc, test_thread_churn);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return tl_run(jalloc_suite());
}
