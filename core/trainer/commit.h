/* commit.h: the checkpoint directory protocol (internal).
 *
 * Every rank writes into PATH.partial/.  A rank other than 0, once its files are durable,
 * writes its done marker .rank-RRRRR.done (durably, by rename) holding:
 *   {"format":"ckptfs-rank-done","format_version":1,"job_id":"<decimal u64>","seq":S,
 *    "world":W,"rank":R,"groups":[...],"files":[{"name":N,"size":B},...]}
 * Rank 0, once its own files are durable, polls PATH.partial/ (readdir, then open) until every
 * other rank's marker with the same job_id, seq and world is there, checks every listed file's
 * size, removes every other entry (stale files of a crashed save, markers, empty directories;
 * one it cannot remove, such as a non-empty directory, fails the commit naming it),
 * writes the completion marker ckptfs-checkpoint.json (fsynced, by rename):
 *   {"format":"ckptfs-checkpoint","format_version":1,"job_id":"<decimal u64>","seq":S,
 *    "world":W,"time":"YYYY-MM-DDTHH:MM:SSZ","groups":[...sorted union],
 *    "ranks":[{"rank":R,"files":[{"name":N,"size":B},...]},...],"extra":{...}}
 * renames PATH.partial to PATH (never over an existing PATH) and fsyncs the parent.  A crash
 * at any point leaves PATH absent.  job_id is a string so that no JSON reader rounds it.
 *
 * A rank whose save fails (a write error; on rank 0 also the commit, a timeout or another
 * rank's failure) leaves .rank-RRRRR.failed (best effort, same way as a done marker):
 *   {"format":"ckptfs-rank-failed","format_version":1,"job_id":"<decimal u64>","seq":S,
 *    "world":W,"rank":R,"errno":E,"error":"PATH...: reason"}
 * Rank 0 fails the save as soon as it sees one of this save (instead of at the timeout), and
 * ranks waiting for the completion marker stop as soon as rank 0's is there.  Markers of
 * other saves are ignored and, like every unlisted entry, removed by a later commit.
 *
 * Threads: a tr_ckpt is used by one thread at a time (the caller's thread at the start of a
 * save, then the background thread that finishes it).
 */
#ifndef CKPTFS_TRAINER_COMMIT_H
#define CKPTFS_TRAINER_COMMIT_H

#include <stddef.h>
#include <stdint.h>

#define TR_DONE_FORMAT "ckptfs-rank-done"
#define TR_FAILED_FORMAT "ckptfs-rank-failed"

struct tr_file_rec {
	char *name;
	uint64_t size;
};

struct tr_ckpt {
	char *path;            /* the final directory name, without trailing '/' */
	char *partial;         /* path + ".partial" */
	char *parent;          /* the directory holding both ("." for a relative plain name) */
	int dirfd;             /* PATH.partial, open from tr_ckpt_prepare() on; -1 before */
	int rank, world;
	uint64_t job_id, seq;
	int timeout_ms;
	struct tr_file_rec *files; /* this rank's files */
	size_t n_files;
	char **groups;         /* this rank's tensor groups */
	size_t n_groups;
	char *extra;           /* rank 0: the manifest_extra JSON text, or NULL */
	int published;         /* rank 0: PATH.partial was renamed to PATH (dirfd is now PATH,
	                          where nothing may be written any more) */
};

/* Fills the names of c from path (copied); the caller fills the rest.  -EINVAL/-ENOMEM. */
int tr_ckpt_init(struct tr_ckpt *c, const char *path, char *err, size_t errlen);
void tr_ckpt_release(struct tr_ckpt *c);

/* At the start of a save: -EEXIST if PATH exists; makes PATH.partial (existing is fine),
 * opens it, removes this rank's stale done marker. */
int tr_ckpt_prepare(struct tr_ckpt *c, char *err, size_t errlen);
/* Ranks != 0: the done marker, durably. */
int tr_done_marker_write(struct tr_ckpt *c, char *err, size_t errlen);
/* Any rank whose save failed with error (negative errno) and message msg: the failure marker
 * (best effort; 0 or the negative errno of writing it). */
int tr_failed_marker_write(struct tr_ckpt *c, int error, const char *msg);
/* Rank 0: waits for the other ranks and completes the checkpoint.  -ETIMEDOUT names the
 * ranks whose marker is missing; a rank's failure marker fails it at once with that rank's
 * errno and message. */
int tr_commit(struct tr_ckpt *c, char *err, size_t errlen);
/* Ranks != 0 with wait_commit: waits for PATH/ckptfs-checkpoint.json of this job and seq, or
 * rank 0's failure marker of this save (then its errno and message). */
int tr_wait_complete(struct tr_ckpt *c, char *err, size_t errlen);

/* Name of rank r's done marker, and of its failure marker. */
void tr_done_marker_name(char *buf, size_t len, int rank);
void tr_failed_marker_name(char *buf, size_t len, int rank);

#endif /* CKPTFS_TRAINER_COMMIT_H */
