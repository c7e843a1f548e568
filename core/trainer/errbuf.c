/* errbuf.c: the last error of a saver (set by the caller's thread or a background thread),
 * small formatting, clock and thread helpers. */
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <jansson.h>

#include "base/util.h"
#include "trainer/trainer_int.h"

void tr_errbuf_init(struct tr_errbuf *e)
{
	pthread_mutex_init(&e->lock, NULL);
	e->err = 0;
	e->msg[0] = '\0';
}

void tr_errbuf_destroy(struct tr_errbuf *e)
{
	pthread_mutex_destroy(&e->lock);
}

int tr_errbuf_set(struct tr_errbuf *e, int err, const char *fmt, ...)
{
	va_list ap;

	pthread_mutex_lock(&e->lock);
	e->err = err;
	va_start(ap, fmt);
	vsnprintf(e->msg, sizeof(e->msg), fmt, ap);
	va_end(ap);
	ckpt_str_one_line(e->msg);
	pthread_mutex_unlock(&e->lock);
	return err;
}

void tr_errbuf_clear(struct tr_errbuf *e)
{
	pthread_mutex_lock(&e->lock);
	e->err = 0;
	e->msg[0] = '\0';
	pthread_mutex_unlock(&e->lock);
}

int tr_errbuf_get(struct tr_errbuf *e, char *buf, size_t len)
{
	int err;

	pthread_mutex_lock(&e->lock);
	err = e->err;
	if (buf && len > 0)
		snprintf(buf, len, "%s", e->msg);
	pthread_mutex_unlock(&e->lock);
	return err;
}

void tr_fmt(char *buf, size_t len, const char *fmt, ...)
{
	va_list ap;

	if (!buf || len == 0)
		return;
	va_start(ap, fmt);
	vsnprintf(buf, len, fmt, ap);
	va_end(ap);
	ckpt_str_one_line(buf);
}

uint64_t tr_now_ns(void)
{
	return (uint64_t)ckpt_mono_ns();
}

int tr_thread_start(pthread_t *t, void *(*fn)(void *), void *arg)
{
	sigset_t all, old;
	int rc;

	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	rc = pthread_create(t, NULL, fn, arg);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	return rc;
}

/* Strings from json_dumps() come from jansson's allocator (which the library replaces with an
 * arena-aware one, core/base/jalloc.h): free them with it, never with free(). */
void tr_json_free(void *p)
{
	json_free_t f = NULL;

	if (!p)
		return;
	json_get_alloc_funcs(NULL, &f);
	f(p);
}
