/* SPDX-License-Identifier: MIT */
/*
 * fuzz_shardmeta.c - the sharding-metadata parser (views/shardmeta.h).
 *
 * Input: HEADER NUL VALUE, or VALUE alone.  HEADER is a safetensors header
 * (the JSON after the length prefix) that gives the tensors; without it the
 * harness uses a small built-in one (tensors named like a Llama layer, a 1-D
 * tensor for flat ranges, a scalar).  VALUE is the JSON text of
 * __metadata__["ckptfs"]: the harness writes it into the header
 * (ckpt_st_serialize, as a string) so that the fuzzer mutates the metadata
 * JSON itself rather than its escaped form.
 *
 * A value that ckpt_shardmeta_parse() refuses must come with a one-line
 * reason; an accepted one must give every tensor a geometry that keeps the
 * rules of shardmeta.h (box inside global_shape, flat ranges within the box
 * and the stored length, tp_dim and pp in range), and
 * ckpt_shardmeta_serialize() of what was parsed must parse back to the same
 * values.  The name rules (ckpt_layer_from_name, ckpt_pp_from_name,
 * ckpt_tp_rules_dim) run on every tensor name.
 */
#include "fuzz.h"
#include "metacheck.h"

#include <errno.h>

#include "views/safetensors.h"
#include "views/shardmeta.h"

static const uint64_t sh_emb[] = { 16, 8 }, sh_q[] = { 8, 8 }, sh_down[] = { 8, 16 },
		      sh_norm[] = { 8 }, sh_flat[] = { 12 };
static const struct ckpt_st_tensor_spec default_tensors[] = {
	{ "model.embed_tokens.weight", CKPT_DT_BF16, 2, sh_emb },
	{ "model.layers.0.self_attn.q_proj.weight", CKPT_DT_F32, 2, sh_q },
	{ "model.layers.1.mlp.down_proj.weight", CKPT_DT_F16, 2, sh_down },
	{ "model.norm.weight", CKPT_DT_F32, 1, sh_norm },
	{ "flat", CKPT_DT_F32, 1, sh_flat },
	{ "scalar", CKPT_DT_F64, 0, NULL },
};

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	fuzz_quiet();
	return 0;
}

/* A header of the given tensors (in that data order) whose metadata is base's
 * without its "ckptfs" key, plus "ckptfs" = value.  NULL when value is not
 * valid UTF-8 (it cannot be a JSON string then) or out of memory. */
static ckpt_st_header *make_header(const struct ckpt_st_tensor_spec *specs, size_t nt,
				   const ckpt_st_header *base, const char *value)
{
	size_t nm = ckpt_st_metadata_count(base), k = 0;
	const char **keys = calloc(nm + 1, sizeof(*keys)), **vals = calloc(nm + 1, sizeof(*vals));
	ckpt_st_header *h = NULL;
	uint8_t *buf = NULL;
	size_t len;
	char err[256];

	if (!keys || !vals)
		goto out;
	for (size_t i = 0; i < nm; i++) {
		ckpt_st_metadata_at(base, i, &keys[k], &vals[k]);
		if (strcmp(keys[k], CKPT_SHARDMETA_KEY) != 0)
			k++;
	}
	keys[k] = CKPT_SHARDMETA_KEY;
	vals[k] = value;
	if (ckpt_st_serialize(specs, nt, keys, vals, k + 1, &buf, &len) < 0)
		goto out;
	if (ckpt_st_parse(buf + CKPT_ST_PREFIX_LEN, len - CKPT_ST_PREFIX_LEN, &h, err,
			  sizeof(err)) == -ENOMEM)
		goto out;
	FUZZ_CHECK(h != NULL, "a serialized header does not parse: %s", err);
out:
	free(buf);
	free(keys);
	free(vals);
	return h;
}

static void check_meta(const ckpt_shardmeta *m, const struct ckpt_st_tensor *t,
		       const struct ckpt_tensor_meta *tm)
{
	uint64_t nl = 0;
	bool has_nl = ckpt_shardmeta_num_layers(m, &nl);
	const char *why = fuzz_meta_problem(t, tm, has_nl, nl);

	FUZZ_CHECK(!why, "tensor '%s': %s", t->name, why);
	/* what parse gives beyond what a geometry must hold: no pp when none is given,
	 * layer 0 with a fixed placement */
	FUZZ_CHECK(tm->has_pp || (tm->pp.kind == 0 && tm->pp.layer == 0),
		   "'%s': pp without has_pp", t->name);
	FUZZ_CHECK(tm->pp.kind == CKPT_PP_LAYER || tm->pp.layer == 0,
		   "'%s': a pp layer with a fixed placement", t->name);
}

static bool meta_eq(const struct ckpt_tensor_meta *a, const struct ckpt_tensor_meta *b)
{
	size_t dims = sizeof(a->global_shape);

	return a->ndim == b->ndim && memcmp(a->global_shape, b->global_shape, dims) == 0 &&
	       a->geom.box.ndim == b->geom.box.ndim &&
	       memcmp(a->geom.box.off, b->geom.box.off, dims) == 0 &&
	       memcmp(a->geom.box.shape, b->geom.box.shape, dims) == 0 &&
	       a->geom.flat == b->geom.flat && a->geom.flat_begin == b->geom.flat_begin &&
	       a->geom.flat_end == b->geom.flat_end && a->tp_dim == b->tp_dim &&
	       a->has_pp == b->has_pp && a->pp.kind == b->pp.kind && a->pp.layer == b->pp.layer;
}

/* Serialize m's view of every tensor of h and parse it back. */
static void check_roundtrip(const ckpt_st_header *h, const ckpt_shardmeta *m,
			    const struct ckpt_st_tensor_spec *specs, size_t nt,
			    const struct ckpt_tensor_meta *tms)
{
	struct ckpt_shardmeta_out *out = calloc(nt ? nt : 1, sizeof(*out));
	ckpt_shardmeta *m2 = NULL;
	ckpt_st_header *h2 = NULL;
	char *json = NULL, err[256];
	uint64_t nl = 0;
	bool has_nl = ckpt_shardmeta_num_layers(m, &nl);
	int r;

	if (!out)
		return;
	for (size_t i = 0; i < nt; i++)
		out[i] = (struct ckpt_shardmeta_out){ specs[i].name, &tms[i] };
	r = ckpt_shardmeta_serialize(ckpt_shardmeta_group(m), has_nl, nl, out, nt, &json);
	if (r == -ENOMEM)
		goto out;
	FUZZ_CHECK(r == 0, "serialize of parsed metadata: %d", r);
	h2 = make_header(specs, nt, h, json);
	if (!h2)
		goto out;
	r = ckpt_shardmeta_parse(h2, &m2, err, sizeof(err));
	if (r == -ENOMEM)
		goto out;
	FUZZ_CHECK(r == 0, "serialized metadata does not parse: %s (%s)", err, json);
	FUZZ_CHECK(strcmp(ckpt_shardmeta_group(m2), ckpt_shardmeta_group(m)) == 0, "group");
	{
		uint64_t nl2 = 0;
		bool has2 = ckpt_shardmeta_num_layers(m2, &nl2);

		FUZZ_CHECK(has2 == has_nl && nl2 == nl, "num_layers");
	}
	for (size_t i = 0; i < nt; i++) {
		struct ckpt_tensor_meta tm2;

		FUZZ_CHECK(ckpt_shardmeta_tensor(m2, ckpt_st_tensor_find(h2, specs[i].name), &tm2) ==
				   0,
			   "tensor '%s' after the round trip", specs[i].name);
		FUZZ_CHECK(meta_eq(&tms[i], &tm2), "tensor '%s' changed in the round trip (%s)",
			   specs[i].name, json);
	}
out:
	ckpt_shardmeta_free(m2);
	ckpt_st_header_free(h2);
	free(json);
	free(out);
}

static void check_names(const struct ckpt_st_tensor *t)
{
	struct ckpt_pp pp;
	uint64_t layer = 0;
	bool has = ckpt_layer_from_name(t->name, &layer);
	int d = ckpt_tp_rules_dim(NULL, t->name, t->ndim);

	ckpt_pp_from_name(t->name, &pp);
	FUZZ_CHECK(has ? (pp.kind == CKPT_PP_LAYER && pp.layer == layer)
		       : (pp.kind == CKPT_PP_FIRST || pp.kind == CKPT_PP_LAST),
		   "'%s': pp from the name", t->name);
	FUZZ_CHECK(d >= -1 && d < (int)t->ndim, "'%s': tp dim %d of %u", t->name, d, t->ndim);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const uint8_t *nul = memchr(data, '\0', size);
	struct ckpt_st_tensor_spec *specs = NULL;
	struct ckpt_tensor_meta *tms = NULL;
	ckpt_st_header *base = NULL, *h = NULL;
	ckpt_shardmeta *m = NULL;
	char *value = NULL, err[256];
	size_t nt;
	int r;

	if (nul) {
		/* a header of the fuzzer's */
		if (ckpt_st_parse(data, (size_t)(nul - data), &base, NULL, 0) < 0)
			return 0;
		value = fuzz_strndup(nul + 1, size - (size_t)(nul - data) - 1);
		nt = ckpt_st_tensor_count(base);
		specs = calloc(nt ? nt : 1, sizeof(*specs));
		if (!value || !specs)
			goto out;
		for (size_t i = 0; i < nt; i++) {
			const struct ckpt_st_tensor *t = ckpt_st_tensor_at(base, i);

			specs[i] = (struct ckpt_st_tensor_spec){ t->name, t->dtype, t->ndim, t->shape };
		}
	} else {
		value = fuzz_strndup(data, size);
		nt = CKPT_ARRAY_SIZE(default_tensors);
		specs = malloc(sizeof(default_tensors));
		if (!value || !specs)
			goto out;
		memcpy(specs, default_tensors, sizeof(default_tensors));
	}
	h = make_header(specs, nt, base, value);
	if (!h)
		goto out;
	r = ckpt_shardmeta_parse(h, &m, err, sizeof(err));
	if (r < 0) {
		FUZZ_CHECK(m == NULL, "metadata left set on error");
		FUZZ_CHECK(r == -EINVAL || r == -EPROTONOSUPPORT || r == -ENOMEM, "error %d", r);
		FUZZ_CHECK(err[0] != '\0', "refused without a reason");
		fuzz_check_err_line(err);
		goto out;
	}
	FUZZ_CHECK(err[0] == '\0', "accepted with a reason: %s", err);
	{
		const char *g = ckpt_shardmeta_group(m);

		FUZZ_CHECK(g[0] && strlen(g) <= CKPT_SHARDMETA_GROUP_MAX && !strchr(g, '/') &&
				   g[0] != '.',
			   "group '%s'", g);
	}
	tms = calloc(nt ? nt : 1, sizeof(*tms));
	if (!tms)
		goto out;
	for (size_t i = 0; i < nt; i++) {
		const struct ckpt_st_tensor *t = ckpt_st_tensor_find(h, specs[i].name);

		check_names(t);
		r = ckpt_shardmeta_tensor(m, t, &tms[i]);
		if (r < 0) {
			/* a whole tensor of more dims than views handle */
			FUZZ_CHECK(r == -EINVAL && t->ndim > CKPT_MAX_DIMS, "'%s': %d", t->name, r);
			goto out;
		}
		check_meta(m, t, &tms[i]);
	}
	check_roundtrip(h, m, specs, nt, tms);
out:
	ckpt_shardmeta_free(m);
	ckpt_st_header_free(h);
	ckpt_st_header_free(base);
	free(value);
	free(specs);
	free(tms);
	return 0;
}
