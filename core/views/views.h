/* SPDX-License-Identifier: MIT */
/*
 * views.h - the contract of the views subsystem (core/views): resharded
 * views, the safetensors files of one stored directory as they would be for
 * another tensor/pipeline-parallel layout (docs/views.md).  Including this
 * header gives the whole public API.
 *
 * Public modules, each with its own header:
 *   safetensors.h  parse and serialize safetensors headers (jansson); dtypes
 *   shardmeta.h    the "ckptfs" sharding metadata of a header; tp rules;
 *                  pipeline placement of a tensor by its name
 *   layout.h       layout arithmetic (tpT_ppP names, torch.chunk bounds,
 *                  byte runs of a piece inside a part): pure functions
 *   view.h         views and open view files over a ckpt_store
 * Internal (view_int.h): vcache.c (the process-wide caches), source.c (the
 * parse of each source, persisted by parsrec.c), model.c (pieces, global
 * tensors, groups), plan.c (files of a layout and their headers), vcheck.c
 * (runs and checks of each tensor), vfile.c (open files and reads), view.c
 * (the view object).
 *
 * Ownership: objects come from the calls named new, parse or build and go
 * with the matching free or unref, which accept NULL.  Strings and arrays returned
 * by accessors belong to the object they came from and live as long as it.
 * A view holds a reference on its model (shared by the views of every
 * layout of one unchanged directory, through a cache), the model one on
 * the parse of each source (shared the same way); an open view file holds
 * a reference on its view.  The caches hold their newest entries: call
 * ckpt_view_forget_store() before ckpt_store_free().
 *
 * Snapshot semantics: a view keeps the extent lists of its sources as they
 * were at build time, so an open file keeps serving the same bytes whatever
 * happens to the sources (chunks are only removed by `ckpt gc`, which needs
 * the store unmounted).
 *
 * Thread-safety: safetensors, shardmeta and layout calls share no state
 * (an object may be read from several threads, changed from one).  Views
 * and the caches may be used from any number of threads: a built view only
 * changes by planning its files on first use (under its own lock), and a
 * view file may be read from several threads at once.
 *
 * Errors: negative errno (-EINVAL bad input, -EIO a source or the store
 * cannot serve, -ENOMEM, or the store's error); no call aborts on bad input.
 * Calls that take (char *err, size_t errlen) put there one line naming the
 * file and the reason (ckpt_errf); damaged or unsupported sources are
 * logged (ckpt_warn) and served as ordinary files.
 */
#ifndef CKPT_VIEWS_H
#define CKPT_VIEWS_H

#include "views/layout.h"
#include "views/safetensors.h"
#include "views/shardmeta.h"
#include "views/view.h"

#endif
