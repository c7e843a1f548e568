/* SPDX-License-Identifier: MIT */
/*
 * report.c - what the store tells about itself while it runs: its metrics
 * (rendered with base/metrics.h's, see ckpt_store_metrics_register) and the
 * summary lines of background work.
 */
#include "store/store_int.h"

#define BG_REPORT_INTERVAL_NS (60 * 1000000000ll)

static double mib(uint64_t b)
{
	return (double)b / (1 << 20);
}

void st_bg_report(ckpt_store *s, bool force)
{
	struct st_bg_report *g = &s->bgrep;
	struct ckpt_bg_stats now, d;
	int64_t t = ckpt_mono_ns();

	ckpt_store_bg_stats(s, &now);
	if (g->rl.interval_ns == 0) { /* first call */
		g->rl.interval_ns = BG_REPORT_INTERVAL_NS;
		g->since_ns = t;
	}
	if ((now.compressed != g->seen.compressed || now.incompressible != g->seen.incompressible ||
	     now.moved != g->seen.moved || now.packs_deleted != g->seen.packs_deleted))
		g->passes++;
	g->seen = now;
	d.compressed = now.compressed - g->logged.compressed;
	d.incompressible = now.incompressible - g->logged.incompressible;
	d.compressed_in = now.compressed_in - g->logged.compressed_in;
	d.compressed_out = now.compressed_out - g->logged.compressed_out;
	d.moved = now.moved - g->logged.moved;
	d.packs_deleted = now.packs_deleted - g->logged.packs_deleted;
	if (g->passes == 0)
		return; /* nothing done since the last line */
	if (force)
		g->rl.last_ns = t;
	else if (!ckpt_ratelimit_ok(&g->rl, t))
		return;
	ckpt_info("%s: background work, %u pass%s in %.0f s: compressed %" PRIu64
		  " chunks and left %" PRIu64 " raw (incompressible), %.1f MiB to %.1f MiB "
		  "(ratio %.2f); compaction moved %" PRIu64 " chunks and deleted %" PRIu64
		  " pack%s; %" PRIu64 " chunks wait for compression",
		  s->path, g->passes, g->passes == 1 ? "" : "es", (double)(t - g->since_ns) / 1e9,
		  d.compressed, d.incompressible, mib(d.compressed_in), mib(d.compressed_out),
		  d.compressed_out ? (double)d.compressed_in / (double)d.compressed_out : 1.0,
		  d.moved, d.packs_deleted, d.packs_deleted == 1 ? "" : "s", now.queued);
	g->logged = now;
	g->passes = 0;
	g->since_ns = t;
}

/* --------------------------------------------------------------- metrics */

static void collect(void *arg, ckpt_mw *w)
{
	ckpt_store *s = arg;
	struct ckpt_cache_stats cs;
	struct ckpt_bg_stats bg;
	uint64_t overlay_n, overlay_bytes;

	ckpt_cache_get_stats(s->cache, &cs);
	ckpt_store_bg_stats(s, &bg);
	pthread_mutex_lock(&s->overlay_lock);
	overlay_n = s->overlay_n;
	overlay_bytes = s->overlay_bytes;
	pthread_mutex_unlock(&s->overlay_lock);

	ckpt_mw_family(w, "ckptfs_compress_input_bytes_total", "counter",
		       "Raw bytes given to the compressor, while writing (inline) or by "
		       "background work.");
	ckpt_mw_u64(w, "ckptfs_compress_input_bytes_total", "stage=\"inline\"",
		    ckpt_metric_get(CKPT_M_COMPRESS_IN_INLINE));
	ckpt_mw_u64(w, "ckptfs_compress_input_bytes_total", "stage=\"background\"",
		    bg.compressed_in);
	ckpt_mw_family(w, "ckptfs_compress_output_bytes_total", "counter",
		       "Bytes the compressor's output took (the raw size where compression "
		       "did not pay); input/output is the compression ratio.");
	ckpt_mw_u64(w, "ckptfs_compress_output_bytes_total", "stage=\"inline\"",
		    ckpt_metric_get(CKPT_M_COMPRESS_OUT_INLINE));
	ckpt_mw_u64(w, "ckptfs_compress_output_bytes_total", "stage=\"background\"",
		    bg.compressed_out);

	ckpt_mw_family(w, "ckptfs_chunk_cache_hits_total", "counter",
		       "Chunk loads served by the cache of decompressed chunks.");
	ckpt_mw_u64(w, "ckptfs_chunk_cache_hits_total", NULL, cs.hits);
	ckpt_mw_family(w, "ckptfs_chunk_cache_misses_total", "counter",
		       "Chunk loads that read and decompressed the chunk (readers' misses; "
		       "read-ahead's loads are not counted).");
	ckpt_mw_u64(w, "ckptfs_chunk_cache_misses_total", NULL, cs.misses);
	ckpt_mw_family(w, "ckptfs_chunk_cache_evictions_total", "counter",
		       "Chunks evicted from the cache.");
	ckpt_mw_u64(w, "ckptfs_chunk_cache_evictions_total", NULL, cs.evictions);
	ckpt_mw_family(w, "ckptfs_chunk_cache_bytes", "gauge",
		       "Decompressed bytes the chunk cache holds.");
	ckpt_mw_u64(w, "ckptfs_chunk_cache_bytes", NULL, cs.bytes);

	ckpt_mw_family(w, "ckptfs_background_chunks_total", "counter",
		       "Chunks handled by background work: compressed, left raw "
		       "(incompressible), moved by compaction.");
	ckpt_mw_u64(w, "ckptfs_background_chunks_total", "result=\"compressed\"", bg.compressed);
	ckpt_mw_u64(w, "ckptfs_background_chunks_total", "result=\"incompressible\"",
		    bg.incompressible);
	ckpt_mw_u64(w, "ckptfs_background_chunks_total", "result=\"moved\"", bg.moved);
	ckpt_mw_family(w, "ckptfs_background_packs_deleted_total", "counter",
		       "Pack files reclaimed by background compaction.");
	ckpt_mw_u64(w, "ckptfs_background_packs_deleted_total", NULL, bg.packs_deleted);
	ckpt_mw_family(w, "ckptfs_background_queued_chunks", "gauge",
		       "Backlog: chunks stored raw that wait for background compression.");
	ckpt_mw_u64(w, "ckptfs_background_queued_chunks", NULL, bg.queued);
	ckpt_mw_family(w, "ckptfs_unindexed_files", "gauge",
		       "Backlog: closed files whose content is not yet committed to the index.");
	ckpt_mw_u64(w, "ckptfs_unindexed_files", NULL, overlay_n);
	ckpt_mw_family(w, "ckptfs_unindexed_bytes", "gauge",
		       "Logical bytes of those files.");
	ckpt_mw_u64(w, "ckptfs_unindexed_bytes", NULL, overlay_bytes);
}

int ckpt_store_metrics_register(ckpt_store *s)
{
	return ckpt_metrics_register(collect, s);
}

void st_metrics_unregister(ckpt_store *s)
{
	ckpt_metrics_unregister(collect, s);
}
