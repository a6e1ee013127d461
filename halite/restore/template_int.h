/* SPDX-License-Identifier: MIT */
/*
 * Private: what a session (session.c) asks of its template (template.c).
 *
 * A session that faults on a stored block not yet in the memory file asks
 * for it with tpl_request(); the template reads and decodes the block's LB
 * once, on its reader threads, and then calls the session's block_in for
 * each block it waited for (from a reader thread, never under the
 * template's lock). A session being freed withdraws what it waits for
 * with tpl_detach(), which returns only when no callback on it is running
 * or can start.
 */
#ifndef HALITE_TEMPLATE_INT_H
#define HALITE_TEMPLATE_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <halite/template.h>

/* The file's memory-block geometry as sessions need it. */
struct tpl_region {
	char name[HALITE_MAX_REGION_NAME + 1];
	uint64_t offset;   /* in the memory file */
	uint64_t length;
	uint64_t first_mb; /* the file's MB numbering */
	uint64_t mb_count;
};

uint32_t tpl_mb_size(const struct halite_template *t);
uint32_t tpl_lb_size(const struct halite_template *t);
uint32_t tpl_region_count(const struct halite_template *t);
const struct tpl_region *tpl_region_at(const struct halite_template *t, uint32_t i);
int tpl_find_region(const struct halite_template *t, const char *name);

/* What a block is: */
enum { TPL_MB_EMPTY, TPL_MB_IN, TPL_MB_OUT };
/*
 * EMPTY (zero or never touched: the zero page), IN (in the memory file), OUT;
 * or the failure of its map entry's lookup (a format 1.1 file's damaged
 * index chunk, -HALITE_E_CHECKSUM, ...: the template's error, and
 * tpl_errmsg_mb() names the chunk), which is never EMPTY.
 */
int tpl_mb_state(struct halite_template *t, uint64_t mb);

/*
 * A session as the template sees it (embedded in the session): its
 * requests not yet answered and its callbacks running, both under the
 * template's lock.
 */
struct tpl_client {
	/* Block @mb is in (err 0) or its LB failed: called once per request answered. */
	void (*block_in)(struct tpl_client *c, uint64_t mb, uint64_t tag, int err);
	uint64_t pending;
	unsigned callbacks;
	uint64_t lb_asked; /* LBs read because this client asked first */
};

/*
 * Ask for stored block @mb on behalf of @c: 1 when it is in already (the
 * caller maps it), 0 when queued (c->block_in comes later, exactly once,
 * unless the client detaches first), or the failure of its LB
 * (-HALITE_E_LB_CHECKSUM, -EIO, ...: tpl_errmsg_mb() says which), or the
 * failure of its own map entry (as tpl_mb_state()). @tag comes back with the
 * callback.
 */
int tpl_request(struct halite_template *t, struct tpl_client *c, uint64_t mb, uint64_t tag);

/* LBs read because @c asked first (its share of the template's reads). */
uint64_t tpl_lb_asked(struct halite_template *t, const struct tpl_client *c);

/* Requests of @c not yet answered, or being answered (a callback running). */
uint64_t tpl_pending(struct halite_template *t, const struct tpl_client *c);

/* Withdraw every request of @c and wait for callbacks on it to end. */
void tpl_detach(struct halite_template *t, struct tpl_client *c);

/*
 * The stored blocks of @mb's locality block (the reader's array),
 * -HALITE_E_NOT_FOUND (@mb is not stored), or the lookup's failure (as
 * tpl_mb_state()).
 */
int tpl_lb_members(struct halite_template *t, uint64_t mb, const uint64_t **mbs, uint32_t *n);

/*
 * Note a fault on stored block @mb for the hot set (first time wins): by
 * vCPU @vcpu (index + 1; 0: another thread), read at @now by a session that
 * started at @start_ns (halite_now_ns()'s clock).
 */
void tpl_hot_note(struct halite_template *t, uint64_t mb, uint32_t vcpu, uint64_t now,
		  uint64_t start_ns);
/* A copy of the hot set: learned in first-fault order, then a relayouted file's prefix
 * (free() it). 0 or -ENOMEM. */
int tpl_hot_list(struct halite_template *t, uint64_t **mbs, uint64_t *count);
uint32_t tpl_hot_window_ms(const struct halite_template *t);

/* A fault came: demand is busy, the prefetcher holds back. */
void tpl_fault_seen(struct halite_template *t);
/* Every stored block is in. */
bool tpl_complete(struct halite_template *t);

/* The message of LB failure @err for block @mb ("locality block 3 at offset ...: ..."). */
void tpl_errmsg_mb(struct halite_template *t, uint64_t mb, char *buf, size_t len);

#endif
