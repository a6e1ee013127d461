/* SPDX-License-Identifier: MIT */
/*
 * Halite snapshot files, format v1: writer and reader.
 *
 * docs/format.md is the normative description of the bytes. In short: a
 * 4 KiB header, then fixed-size locality blocks (LBs) that each hold several
 * independently compressed memory blocks (MBs), then sections (regions, MB
 * map, LB table, optional vCPU roots, device state, metadata, save
 * statistics), a section directory, and a footer. The file is written front
 * to back in one pass; a file without a valid footer is incomplete.
 *
 * Memory blocks are numbered globally: region 0's blocks first, then region
 * 1's, and so on. The last block of a region may be short when the region's
 * length is not a multiple of the memory-block size.
 *
 * Conventions: every fallible call returns >= 0 on success, a negative errno
 * or -HALITE_E_* on failure (see errors.h); out-parameters are written only
 * on success; *_free(NULL) is fine; options structs start with their size and
 * zero means the default.
 */
#ifndef HALITE_FORMAT_H
#define HALITE_FORMAT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <halite/codec.h>
#include <halite/errors.h>
#include <halite/log.h>

#ifdef __cplusplus
extern "C" {
#endif

#define HALITE_FORMAT_MAJOR 1
#define HALITE_FORMAT_MINOR 1

#define HALITE_DEFAULT_PAGE_SIZE 4096u
#define HALITE_DEFAULT_MB_PAGES 2u
#define HALITE_DEFAULT_LB_SIZE 65536u
#define HALITE_MIN_LB_SIZE 4096u
#define HALITE_MAX_LB_SIZE (4u << 20)
#define HALITE_MAX_REGION_NAME 255u

/* Sets opts.sz; the rest is zero (all defaults). */
#define HALITE_OPTS(type, name) struct type name = { .sz = sizeof(struct type) }

/* ---------------------------------------------------------------------- */
/* Streams: which LB sequence a memory block was appended to.               */

/* A stream id is kind << 24 | index. */
enum halite_stream_kind {
	HALITE_STREAM_VCPU = 0,	    /* first touched by vCPU <index> during the save */
	HALITE_STREAM_VIRTUAL = 1,  /* background walk of guest page tables, virtual order */
	HALITE_STREAM_PHYSICAL = 2, /* background sweep in guest-physical order */
	HALITE_STREAM_OTHER = 3,    /* touched first by a thread that is not a vCPU */
};
#define HALITE_STREAM(kind, index) ((uint32_t)(kind) << 24 | ((uint32_t)(index) & 0xffffffu))
#define HALITE_STREAM_KIND(id) ((uint32_t)(id) >> 24)
#define HALITE_STREAM_INDEX(id) ((uint32_t)(id) & 0xffffffu)
#define HALITE_STREAM_KIND_MAX 3u

/* Writes "vcpu3", "virtual", "physical", "other", or "kind9.5"; returns buf. */
const char *halite_stream_name(uint32_t stream, char *buf, size_t len);

/* ---------------------------------------------------------------------- */
/* Sections                                                                 */

/* Types with bit 31 set are optional: a reader skips them if unknown. */
#define HALITE_SECTION_OPTIONAL 0x80000000u
enum halite_section_type {
	HALITE_SECTION_REGIONS = 1,
	HALITE_SECTION_MB_MAP = 2,
	HALITE_SECTION_LB_TABLE = 3,
	HALITE_SECTION_INDEX = 4,      /* format 1.1: chunk checksums of 2, 3 and 5 */
	HALITE_SECTION_LB_MEMBERS = 5, /* format 1.1: each LB's memory blocks */
	HALITE_SECTION_VCPUS = HALITE_SECTION_OPTIONAL | 1,
	HALITE_SECTION_DEVICE_STATE = HALITE_SECTION_OPTIONAL | 2,
	HALITE_SECTION_METADATA = HALITE_SECTION_OPTIONAL | 3,
	HALITE_SECTION_SAVE_STATS = HALITE_SECTION_OPTIONAL | 4,
};

/* "regions", "mb-map", ..., or NULL for a type this build does not know. */
const char *halite_section_name(uint32_t type);

/* ---------------------------------------------------------------------- */
/* Shared descriptions                                                      */

struct halite_region {
	const char *name; /* 1..255 bytes, unique in the file */
	uint64_t gpa;	  /* guest-physical base; page aligned */
	uint64_t length;  /* bytes; a non-zero multiple of the page size */
};

enum halite_mb_state {
	HALITE_MB_UNTOUCHED = 0, /* never touched by the guest: reads as zero, no bytes stored */
	HALITE_MB_ZERO = 1,	 /* all zero at the snapshot instant, no bytes stored */
	HALITE_MB_STORED = 2,	 /* bytes in locality block @lb */
};

struct halite_mb_loc {
	uint32_t state;	  /* enum halite_mb_state */
	bool compressed;  /* STORED: compressed with the file's codec, else raw */
	uint64_t lb;	  /* STORED: locality block index */
	uint32_t offset;  /* STORED: byte offset in the locality block */
	uint32_t length;  /* STORED: stored bytes */
};

/* x86-64 paging modes recorded with a page-table root. */
#define HALITE_PAGING_4LEVEL 4u
#define HALITE_PAGING_5LEVEL 5u
#define HALITE_VCPU_UNKNOWN 0xffffffffu

struct halite_root {
	uint32_t vcpu;	  /* vCPU index, or HALITE_VCPU_UNKNOWN */
	uint32_t mode;	  /* HALITE_PAGING_4LEVEL or HALITE_PAGING_5LEVEL */
	uint64_t cr3;	  /* CR3 as seen, flag bits included */
};

/* ---------------------------------------------------------------------- */
/* Writer                                                                   */

struct halite_writer;

#define HALITE_WRITER_DIRECT 0x1u	   /* write locality blocks with O_DIRECT */
#define HALITE_WRITER_NO_SYNC 0x2u	   /* skip fdatasync at finish (tests, scratch files) */
#define HALITE_WRITER_V1_0 0x4u	   /* write format 1.0 (no chunked index): tests, old readers */
#define HALITE_WRITER_FLAGS_ALL 0x7u

/*
 * I/O backends for the writer's locality-block writes (io_backend). The
 * default tries io_uring, then libaio, then pwrite, taking the first the
 * kernel allows (io_uring may be disabled by sysctl or seccomp); an explicit
 * backend the kernel refuses fails halite_writer_create() with
 * -HALITE_E_UNSUPPORTED.
 */
#define HALITE_IO_BACKEND_DEFAULT 0
#define HALITE_IO_BACKEND_URING 1
#define HALITE_IO_BACKEND_AIO 2
#define HALITE_IO_BACKEND_PSYNC 3 /* pwrite: each write done when submitted */
#define HALITE_WRITER_MAX_QUEUE_DEPTH 4096u /* queue_depth at most */

struct halite_writer_opts {
	size_t sz;
	uint32_t page_size;    /* 0 = 4096; power of two, 4 KiB .. 4 MiB */
	uint32_t mb_pages;     /* 0 = 2; pages per memory block, 1 .. 1024 */
	uint32_t lb_size;      /* 0 = 64 KiB; power of two, 4 KiB .. 4 MiB, >= MB size */
	int codec;	       /* enum halite_codec; 0 = lz4 */
	int level;	       /* codec level; 0 = the codec's default */
	unsigned flags;	       /* HALITE_WRITER_* */
	uint32_t vcpu_count;   /* recorded in the vCPU section; 0 = none recorded */
	halite_log_fn log;     /* NULL = silent */
	void *log_ctx;
	int log_level;	       /* enum halite_log_level; messages above are dropped */
	int io_backend;	       /* HALITE_IO_BACKEND_*; 0 = the default above */
	unsigned queue_depth;  /* LB writes in flight at most; 0 = 8, <= MAX_QUEUE_DEPTH */
};

/*
 * Start a snapshot to be written to @path and write its header. The regions
 * are copied.
 *
 * Nothing appears at @path, nor changes there, until halite_writer_finish()
 * succeeds: the file is written under a temporary name in @path's directory
 * (".NAME.XXXXXX", created with O_EXCL; mode 0600, or less if the umask
 * takes more away: it holds guest memory), and finish renames the complete
 * file over @path. An older file at @path survives, byte for byte, every failure, and
 * a reader that has it open keeps reading it after the replace; a reader
 * opening @path sees either the older file or the complete new one, never a
 * part. Only a process killed before halite_writer_free() leaves the
 * temporary file behind.
 *
 * @path is checked first as halite_writer_check_path() does; a refused
 * target fails create with that error, its sentence goes to the log
 * callback, and nothing is created.
 *
 * Locality blocks are written asynchronously, in file order, through
 * @opts->io_backend, at most @opts->queue_depth at a time; the writer keeps
 * up to queue_depth + (number of streams) buffers of lb_size bytes. A write
 * that fails is reported by whichever later call collects it (a put, flush
 * or finish) with the write's own error code (-ENOSPC, -EIO, ...), and the
 * writer is failed from then on.
 */
int halite_writer_create(struct halite_writer **w, const char *path,
			 const struct halite_region *regions, uint32_t nregions,
			 const struct halite_writer_opts *opts);

/*
 * Whether halite_writer_create() takes @opts, checked without creating
 * anything, for tools that validate their options when they parse them:
 * 0, or -EINVAL (-HALITE_E_NO_CODEC for an unknown codec) with one sentence
 * naming the option, the value and the accepted range in @err (may be NULL),
 * e.g. "locality-block size 8 MiB: a power of two from 4 KiB to 4 MiB".
 * Page size: a power of two, 4 KiB .. 4 MiB; pages per memory block
 * 1 .. 1024; locality-block size a power of two, HALITE_MIN_LB_SIZE ..
 * HALITE_MAX_LB_SIZE and at least one memory block; the level in
 * halite_codec_level_range(); queue depth at most
 * HALITE_WRITER_MAX_QUEUE_DEPTH.
 */
int halite_writer_opts_check(const struct halite_writer_opts *opts, char *err, size_t errlen);

/*
 * Whether a snapshot may be written to @path, checked without creating or
 * changing anything: its directory exists and this process may write there,
 * @path is not a directory (nor ends in '/'), whatever is at @path now is a
 * regular file (a snapshot replaces its target: a device or FIFO would be
 * replaced, not written to), and no restore is reading the file now at @path
 * (a running restore holds a shared flock(2) on its file, and a save never
 * replaces it: HALITE_LOCK_PROTOCOL below). Returns 0, or -ENOENT, -ENOTDIR,
 * -EACCES, -EROFS, -EISDIR, -EINVAL (not a regular file) or -EBUSY with one
 * sentence naming the problem in @err (may be NULL).
 * halite_writer_create() makes the same check.
 *
 * HALITE_LOCK_PROTOCOL: readers that must not see their file replaced take
 * flock(fd, LOCK_SH) on it; a writer refuses a target on which
 * flock(LOCK_EX | LOCK_NB) fails, at create. A restore that starts on the
 * older file later keeps reading it: the rename at finish replaces the name,
 * not the inode.
 */
int halite_writer_check_path(const char *path, char *err, size_t errlen);

/* Memory-block size in bytes, and the number of memory blocks in all regions. */
uint32_t halite_writer_mb_size(const struct halite_writer *w);
uint64_t halite_writer_mb_count(const struct halite_writer *w);
/* Bytes in memory block @mb (shorter than the MB size at a region's end). */
uint32_t halite_writer_mb_bytes(const struct halite_writer *w, uint64_t mb);

/*
 * Save memory block @mb (halite_writer_mb_bytes() bytes at @data) into
 * @stream: an all-zero block is recorded as zero and takes no space;
 * otherwise it is compressed (raw if that does not make it smaller) and
 * appended to the stream's current locality block, whose write is submitted
 * when the next block does not fit. Each block may be saved once:
 * -HALITE_E_STATE otherwise. Not thread-safe: one writer thread.
 */
int halite_writer_put(struct halite_writer *w, uint32_t stream, uint64_t mb, const void *data);

/*
 * As halite_writer_put() for a block the caller already encoded (an engine
 * that compresses in its own pool): @len bytes at @payload, compressed with
 * the file's codec or, when !@compressed, raw (then @len must equal the
 * block's size).
 */
int halite_writer_put_encoded(struct halite_writer *w, uint32_t stream, uint64_t mb,
			      const void *payload, uint32_t len, bool compressed);

/* Record memory block @mb as zero without data. */
int halite_writer_put_zero(struct halite_writer *w, uint64_t mb);

/*
 * Write @stream's partly filled locality block now (its slack is zeroed) and
 * wait for every locality-block write in flight to complete.
 */
int halite_writer_flush_stream(struct halite_writer *w, uint32_t stream);

/* Optional sections; each may be given once, before finish. Copied. */
int halite_writer_set_device_state(struct halite_writer *w, const void *data, uint64_t len);
int halite_writer_add_root(struct halite_writer *w, const struct halite_root *root);
/* key: 1..255 bytes of UTF-8; value: up to 1 MiB; a key may be set once. */
int halite_writer_set_meta(struct halite_writer *w, const char *key, const void *value,
			   uint32_t len);
int halite_writer_set_stat(struct halite_writer *w, const char *key, uint64_t value);

/*
 * Write every partly filled locality block, wait for all locality-block
 * writes, then write the sections, the directory and the footer, fdatasync
 * the file, rename it over the target and fsync the directory (neither sync
 * with HALITE_WRITER_NO_SYNC). Memory blocks never put are recorded as never
 * touched. Returns 0 once the complete file is at the target (a directory
 * sync that fails after the rename is only logged as a warning), or the
 * error: then the target is as it was, and the temporary file is the
 * business of halite_writer_free(). After this only halite_writer_free()
 * is valid.
 */
int halite_writer_finish(struct halite_writer *w);

/*
 * Free, after waiting for the locality-block writes in flight. Without a
 * successful finish the target is never touched, and the temporary file is
 * removed when @unlink_incomplete; otherwise it is kept for a look, renamed
 * to "PATH.incomplete" (replacing an older one; readers refuse it unless
 * finish failed only at putting a complete file in place). If that rename
 * fails, the file stays under its temporary name, and a warning names it.
 * NULL is fine.
 */
void halite_writer_free(struct halite_writer *w, bool unlink_incomplete);

/* Detail of the last failure on this handle ("" if none). */
const char *halite_writer_errmsg(const struct halite_writer *w);

/* ---------------------------------------------------------------------- */
/* Reader                                                                   */

struct halite_reader;

#define HALITE_READER_DIRECT 0x1u	/* read locality blocks with O_DIRECT */
#define HALITE_READER_FLAGS_ALL 0x1u

struct halite_reader_opts {
	size_t sz;
	unsigned flags;		  /* HALITE_READER_* */
	uint32_t read_latency_us; /* added to every locality-block read (benchmarks) */
	char *errbuf;		  /* if set, a failed open explains itself here */
	size_t errbuf_len;
	halite_log_fn log;
	void *log_ctx;
	int log_level;
	/*
	 * An open reader of the same path, or NULL: this one reads the
	 * version that one read. For an object of an S3 store it sends no
	 * request to open (no HEAD: the same ETag; what that reader fetched
	 * at open, head, tail and sections, is not fetched again); a file
	 * is opened as usual. Only read during the call.
	 */
	const struct halite_reader *same_as;
};

struct halite_file_info {
	uint16_t version_major, version_minor;
	uint64_t incompat_flags, compat_flags;
	uint8_t uuid[16];
	uint64_t created_ns;	/* CLOCK_REALTIME at creation */
	uint32_t page_size;
	uint32_t mb_pages;
	uint32_t mb_size;
	uint32_t lb_size;
	int codec;
	int codec_level;
	uint64_t file_size;
	uint64_t data_offset;	/* first locality block */
	uint64_t lb_count;
	uint64_t mb_count;
	uint32_t region_count;
	uint64_t mb_untouched, mb_zero, mb_stored, mb_compressed;
	uint64_t stored_bytes;	/* sum of stored memory-block lengths */
	uint64_t memory_bytes;	/* sum of region lengths */
};

struct halite_lb_info {
	uint32_t stream;
	uint32_t seq;	     /* position within its stream, from 0 */
	uint32_t used;	     /* payload bytes; the rest of the block is zero */
	uint32_t mb_count;   /* memory blocks stored in it */
	uint64_t checksum;   /* XXH3-64 as recorded in the LB table */
	uint64_t offset;     /* file offset */
};

struct halite_region_info {
	char name[HALITE_MAX_REGION_NAME + 1];
	uint64_t gpa;
	uint64_t length;
	uint64_t first_mb;
	uint64_t mb_count;
};

/*
 * Open and validate everything but the locality blocks' contents: header,
 * footer, directory, every section's checksum and every field's range; the
 * MB map against the LB table (no two blocks overlap, every block lies inside
 * its LB's used bytes). A file without a valid footer fails with
 * -HALITE_E_INCOMPLETE. Allocation is bounded by the file's size.
 *
 * Format 1.1 files (chunked index, docs/format.md 5.7) are opened in time
 * independent of memory size: open verifies the small index, and each chunk
 * of the MB map, LB table and member lists is read and verified when first
 * used, by whichever call needs it (thread-safe). The lookups below can then
 * fail: -HALITE_E_CHECKSUM or -HALITE_E_CORRUPT naming the chunk, or an I/O
 * error; they never return an entry that was not verified.
 */
int halite_reader_open(struct halite_reader **r, const char *path,
		       const struct halite_reader_opts *opts);
void halite_reader_free(struct halite_reader *r);

/* Detail of the last failure on this handle ("" if none). */
const char *halite_reader_errmsg(const struct halite_reader *r);

/*
 * A snapshot read from an object store (s3://BUCKET/KEY): the requests the
 * store answered and the host's LB cache's part (HALITE_CACHE_DIR,
 * docs/object-store.md), counted over every reader of the object in this
 * process (a restore's prefetch included). All zero for a local file.
 */
struct halite_store_stats {
	uint64_t requests;	  /* sent to the store, retries included */
	uint64_t retries;
	uint64_t bytes;		  /* response bodies received */
	uint64_t connects;	  /* connections opened (the rest reused one) */
	uint64_t cache_hits;	  /* reads the host's LB cache answered */
	uint64_t cache_misses;	  /* reads it did not (then sent to the store) */
	uint64_t cache_bytes_hit;
	uint64_t cache_puts;	  /* store answers kept in it */
	uint64_t cache_put_errors; /* ... that it could not keep (a full disk, ...) */
	uint64_t cache_evictions; /* entries removed to stay in its bound, by these puts */
	bool cached;		  /* a cache is in use */
};
void halite_reader_store_stats(const struct halite_reader *r, struct halite_store_stats *st);

const struct halite_file_info *halite_reader_info(const struct halite_reader *r);
const struct halite_region_info *halite_reader_region(const struct halite_reader *r,
						      uint32_t idx);
/* Index of the region called @name, or -HALITE_E_NOT_FOUND. */
int halite_reader_find_region(const struct halite_reader *r, const char *name);

/* Bytes in memory block @mb; 0 when out of range. */
uint32_t halite_reader_mb_bytes(const struct halite_reader *r, uint64_t mb);
/*
 * Where memory block @mb is. -ERANGE when @mb >= mb_count; with a 1.1 file, a
 * failure of the chunk holding it, or of its LB's member list (stored MBs are
 * checked against it before they are returned).
 */
int halite_reader_mb_lookup(const struct halite_reader *r, uint64_t mb, struct halite_mb_loc *loc);

int halite_reader_lb_info(const struct halite_reader *r, uint64_t lb, struct halite_lb_info *info);
/*
 * The memory blocks stored in locality block @lb, in the order of their bytes
 * in it. The array belongs to the reader.
 */
int halite_reader_lb_members(const struct halite_reader *r, uint64_t lb, const uint64_t **mbs,
			     uint32_t *count);

/*
 * Read locality block @lb into @buf (lb_size bytes; aligned with
 * halite_reader_alloc_lb() when the reader uses O_DIRECT) and verify its
 * checksum: -HALITE_E_LB_CHECKSUM (naming the block in errmsg and the log) if
 * it does not match, in which case @buf's bytes must not be used.
 * Thread-safe.
 */
int halite_reader_read_lb(struct halite_reader *r, uint64_t lb, void *buf);

/* Verify an LB the caller read itself. Thread-safe. */
int halite_reader_verify_lb(struct halite_reader *r, uint64_t lb, const void *buf);

/* An lb_size buffer suitable for halite_reader_read_lb(); free with halite_reader_free_lb(). */
void *halite_reader_alloc_lb(const struct halite_reader *r);
void halite_reader_free_lb(void *buf);

/*
 * Decode memory block @mb from its verified locality block at @lb_buf into
 * @out (halite_reader_mb_bytes() bytes). Zero and untouched blocks give zeros
 * and need no @lb_buf. @lb_buf must be the locality block the MB map names
 * (halite_reader_mb_lookup), read and verified. Thread-safe.
 */
int halite_reader_decode_mb(struct halite_reader *r, uint64_t mb, const void *lb_buf, void *out);

/* Read, verify and decode one memory block (convenience; slow for many). */
int halite_reader_read_mb(struct halite_reader *r, uint64_t mb, void *out);

/*
 * Optional sections. Each returns -HALITE_E_NOT_FOUND if the file has none.
 * Pointers belong to the reader and stay valid until it is freed.
 */
int halite_reader_device_state(struct halite_reader *r, const void **data, uint64_t *len);
int halite_reader_vcpus(const struct halite_reader *r, uint32_t *vcpu_count,
			const struct halite_root **roots, uint32_t *root_count);
uint32_t halite_reader_meta_count(const struct halite_reader *r);
int halite_reader_meta(const struct halite_reader *r, uint32_t idx, const char **key,
		       const void **value, uint32_t *len);
/* The metadata entry @key (keys are unique in a file), or -HALITE_E_NOT_FOUND. */
int halite_reader_meta_find(const struct halite_reader *r, const char *key, const void **value,
			    uint32_t *len);
uint32_t halite_reader_stat_count(const struct halite_reader *r);
int halite_reader_stat(const struct halite_reader *r, uint32_t idx, const char **key,
		       uint64_t *value);

/* The section directory, for tools: type, offset and length of entry @idx. */
uint32_t halite_reader_section_count(const struct halite_reader *r);
int halite_reader_section(const struct halite_reader *r, uint32_t idx, uint32_t *type,
			  uint64_t *offset, uint64_t *length);
/*
 * Read directory entry @idx's bytes and check its checksum, whether or not
 * this build knows the type: 0, -HALITE_E_CHECKSUM, or an I/O error.
 */
int halite_reader_verify_section(struct halite_reader *r, uint32_t idx);

/*
 * Everything a format 1.0 open checks of the MB map, LB table and (1.1)
 * member lists, for the whole file: a 1.1 reader checks each chunk only when
 * it is first used, so tools that vouch for a file (halite-inspect verify)
 * call this. 0, or the first problem (-HALITE_E_CORRUPT, -HALITE_E_CHECKSUM,
 * an I/O error) named in errmsg.
 */
int halite_reader_verify_index(struct halite_reader *r);

#ifdef __cplusplus
}
#endif
#endif /* HALITE_FORMAT_H */
