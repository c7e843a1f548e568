/* SPDX-License-Identifier: MIT */
/*
 * testdir.h - temporary directories for the Check unit tests.
 *
 * Pattern used by the tests that need a store on disk: an unchecked fixture
 * (run in the parent process around each test case) owns a base directory
 * /tmp/check_<module>-XXXXXX and removes it afterwards, because a failed
 * test exits its forked child before the checked teardown runs; each test
 * works in its own directory inside it.
 */
#ifndef CKPT_TESTDIR_H
#define CKPT_TESTDIR_H

#include <check.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>

static int testdir_rm_cb(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
	(void)sb;
	(void)flag;
	(void)ftw;
	return remove(path);
}

/* Remove dir and everything below it, then clear the name.  NULL-safe. */
static inline void testdir_remove(char *dir)
{
	if (dir && dir[0])
		nftw(dir, testdir_rm_cb, 16, FTW_DEPTH | FTW_PHYS);
	if (dir)
		dir[0] = '\0';
}

/* mkdtemp() of "<parent>/<prefix>XXXXXX" into buf (asserts on failure). */
static inline void testdir_make(char *buf, size_t len, const char *parent, const char *prefix)
{
	snprintf(buf, len, "%s/%sXXXXXX", parent, prefix);
	ck_assert_ptr_nonnull(mkdtemp(buf));
}

#endif
