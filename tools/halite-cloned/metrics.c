// SPDX-License-Identifier: MIT
/*
 * halite-cloned: GET /metrics, the Prometheus text format 0.0.4. Clones by
 * state, the time-to-ready histogram, per template what its engine read,
 * decoded and holds (and, from an object store, what it asked of the store
 * and of the host's LB cache), and the clones' faults by kind (clones
 * deleted stay counted: counters never go down while the daemon runs).
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <halite/format.h>

#include "cloned.h"

static const double ready_le[] = CLONED_READY_LE;
#define NLE (sizeof(ready_le) / sizeof(ready_le[0]))

static void head(FILE *f, const char *name, const char *type, const char *help)
{
	fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/*
 * Per template read from an object store: its reader's requests and bytes
 * from the store, and the host's LB cache's answers (lock held). A local
 * template has none of these samples.
 */
static void store_families(FILE *f, struct cloned *d)
{
	static const struct {
		const char *name, *help;
	} fam[] = {
		{ "halite_template_store_requests_total",
		  "Requests sent to the object store for the template's snapshot, retries included." },
		{ "halite_template_store_bytes_total", "Bytes received from the object store." },
		{ "halite_template_store_cache_hits_total",
		  "Locality blocks the host's LB cache answered." },
		{ "halite_template_store_cache_misses_total",
		  "Locality blocks the host's LB cache did not have (then read from the store)." },
		{ "halite_template_store_cache_puts_total",
		  "Locality blocks from the store kept in the host's LB cache." },
	};

	for (size_t k = 0; k < sizeof(fam) / sizeof(fam[0]); k++) {
		head(f, fam[k].name, "counter", fam[k].help);
		for (struct tmpl *tp = d->templates; tp; tp = tp->next) {
			struct halite_store_stats st;
			uint64_t v;

			if (!tmpl_store_stats(tp, &st))
				continue;
			switch (k) {
			case 0: v = st.requests; break;
			case 1: v = st.bytes; break;
			case 2: v = st.cache_hits; break;
			case 3: v = st.cache_misses; break;
			default: v = st.cache_puts; break;
			}
			fprintf(f, "%s{template=\"%s\"} %llu\n", fam[k].name, tp->id,
				(unsigned long long)v);
		}
	}
}

char *metrics_render(struct cloned *d)
{
	uint64_t by_state[CL_NSTATES] = { 0 }, cached, read, zero;
	char *text = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&text, &len);

	if (!f)
		return NULL;
	pthread_mutex_lock(&d->lock);
	clones_poll(d);
	cached = d->retired_cached;
	read = d->retired_read;
	zero = d->retired_zero;
	for (struct clone *c = d->clones; c; c = c->next) {
		struct halite_session_stats st;

		by_state[c->state]++;
		clone_stats(c, &st);
		cached += st.faults_cached;
		read += st.faults_read;
		zero += st.faults_zero;
	}

	head(f, "halite_clones", "gauge", "Clones by state.");
	for (int s = 0; s < CL_NSTATES; s++)
		fprintf(f, "halite_clones{state=\"%s\"} %llu\n", clone_state_name(s),
			(unsigned long long)by_state[s]);

	head(f, "halite_clone_ready_seconds", "histogram",
	     "Time from a clone request to the clone running.");
	for (size_t i = 0; i < NLE; i++)
		fprintf(f, "halite_clone_ready_seconds_bucket{le=\"%g\"} %llu\n", ready_le[i],
			(unsigned long long)d->ready.bucket[i]);
	fprintf(f, "halite_clone_ready_seconds_bucket{le=\"+Inf\"} %llu\n",
		(unsigned long long)d->ready.count);
	fprintf(f, "halite_clone_ready_seconds_sum %.9g\n", d->ready.sum);
	fprintf(f, "halite_clone_ready_seconds_count %llu\n", (unsigned long long)d->ready.count);

	head(f, "halite_clone_faults_total", "counter", "Clone page faults served, by kind.");
	fprintf(f, "halite_clone_faults_total{kind=\"cached\"} %llu\n", (unsigned long long)cached);
	fprintf(f, "halite_clone_faults_total{kind=\"read\"} %llu\n", (unsigned long long)read);
	fprintf(f, "halite_clone_faults_total{kind=\"zero\"} %llu\n", (unsigned long long)zero);

	head(f, "halite_template_cache_limit_bytes", "gauge",
	     "--cache-max: the most all templates' decoded blocks may take (0: no limit).");
	fprintf(f, "halite_template_cache_limit_bytes %llu\n", (unsigned long long)d->o.cache_max);

	/* Per template: one family at a time, as the format wants. */
	static const struct {
		const char *name, *type, *help;
	} fam[] = {
		{ "halite_template_bytes_read_total", "counter",
		  "Bytes of locality blocks read from the snapshot file." },
		{ "halite_template_lb_read_total", "counter",
		  "Locality blocks read, for a waiting fault (demand) or ahead (prefetch)." },
		{ "halite_template_mb_decoded_total", "counter",
		  "Memory blocks decoded into the template memory file." },
		{ "halite_template_cache_hits_total", "counter",
		  "Block requests from clones that found the block in already." },
		{ "halite_template_cache_requests_total", "counter", "Block requests from clones." },
		{ "halite_template_cache_bytes", "gauge",
		  "Resident bytes of the template memory file (the shared decoded-block cache)." },
		{ "halite_template_complete", "gauge",
		  "1 once every stored block is in the template memory file." },
	};
	for (size_t k = 0; k < sizeof(fam) / sizeof(fam[0]); k++) {
		head(f, fam[k].name, fam[k].type, fam[k].help);
		for (struct tmpl *tp = d->templates; tp; tp = tp->next) {
			struct halite_template_stats st;
			unsigned long long v;

			halite_template_stats(tp->t, &st);
			switch (k) {
			case 0: v = st.bytes_read; break;
			case 1:
				fprintf(f, "%s{template=\"%s\",kind=\"demand\"} %llu\n",
					fam[k].name, tp->id, (unsigned long long)st.lb_demand);
				fprintf(f, "%s{template=\"%s\",kind=\"prefetch\"} %llu\n",
					fam[k].name, tp->id, (unsigned long long)st.lb_prefetch);
				continue;
			case 2: v = st.mb_decoded; break;
			case 3: v = st.hits; break;
			case 4: v = st.requests; break;
			case 5: v = st.mem_bytes; break;
			default: v = st.complete; break;
			}
			fprintf(f, "%s{template=\"%s\"} %llu\n", fam[k].name, tp->id, v);
		}
	}
	store_families(f, d);
	pthread_mutex_unlock(&d->lock);
	if (fclose(f)) {
		free(text);
		return NULL;
	}
	return text;
}
