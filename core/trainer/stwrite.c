/* stwrite.c: durable writes of whole files (stwrite.h). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "trainer/stwrite.h"
#include "trainer/trainer_int.h"

int tr_write_file(int dirfd, const char *dirpath, const char *name, const char *tmp,
		  const void *buf, uint64_t len, size_t write_bytes, char *err, size_t errlen)
{
	const char *p = buf;
	uint64_t off = 0;
	const char *what = "open";
	int fd, ret = 0;

	(void)unlinkat(dirfd, tmp, 0);
	/* EINTR is retried everywhere: the library's threads block signals, but the caller's
	 * thread writes too (a refused save's cleanup) and a FUSE request can be interrupted. */
	do
		fd = openat(dirfd, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	while (fd < 0 && errno == EINTR);
	if (fd < 0) {
		ret = -errno;
		goto out;
	}
	what = "write";
	while (off < len) {
		/* A chunk ends at the next multiple of write_bytes: every write but the last is
		 * write_bytes long and aligned to it in the file. */
		size_t n = write_bytes - (size_t)(off % write_bytes);
		ssize_t w;

		if (n > len - off)
			n = (size_t)(len - off);
		w = pwrite(fd, p + off, n, (off_t)off);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			ret = -errno;
			goto out;
		}
		if (w == 0) {
			ret = -EIO;
			goto out;
		}
		off += (uint64_t)w;
	}
	what = "fsync";
	while (fsync(fd) < 0) {
		if (errno == EINTR)
			continue;
		ret = -errno;
		goto out;
	}
	what = "close";
	/* After EINTR the descriptor is closed on Linux, and the data is already synced. */
	ret = close(fd) < 0 && errno != EINTR ? -errno : 0;
	fd = -1;
	if (ret < 0)
		goto out;
	what = "rename";
	if (renameat(dirfd, tmp, dirfd, name) < 0)
		ret = -errno;
out:
	if (fd >= 0)
		close(fd);
	if (ret < 0) {
		tr_fmt(err, errlen, "%s/%s: %s: %s", dirpath, name, what, strerror(-ret));
		(void)unlinkat(dirfd, tmp, 0);
	}
	return ret;
}

int tr_fsync_dir(int dirfd, const char *dirpath, char *err, size_t errlen)
{
	int e;

	do
		e = fsync(dirfd) == 0 ? 0 : errno;
	while (e == EINTR);
	if (e == 0 || e == EINVAL || e == ENOTSUP || e == ENOSYS)
		return 0;
	tr_fmt(err, errlen, "%s: fsync of the directory: %s", dirpath, strerror(e));
	return -e;
}

int tr_read_small(int dirfd, const char *name, size_t max, char **ret_buf, size_t *ret_len)
{
	struct stat st;
	char *buf = NULL;
	size_t got = 0;
	int fd, ret = 0;

	*ret_buf = NULL;
	fd = openat(dirfd, name, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	if (fstat(fd, &st) < 0) {
		ret = -errno;
		goto out;
	}
	if ((uint64_t)st.st_size > max) {
		ret = -EFBIG;
		goto out;
	}
	buf = malloc((size_t)st.st_size + 1);
	if (!buf) {
		ret = -ENOMEM;
		goto out;
	}
	while (got < (size_t)st.st_size) {
		ssize_t r = read(fd, buf + got, (size_t)st.st_size - got);

		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			ret = -errno;
			goto out;
		}
		if (r == 0)
			break;
		got += (size_t)r;
	}
	buf[got] = '\0';
	*ret_buf = buf;
	if (ret_len)
		*ret_len = got;
	buf = NULL;
out:
	free(buf);
	close(fd);
	return ret;
}
