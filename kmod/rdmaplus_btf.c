// SPDX-License-Identifier: GPL-2.0
/*
 * rdmaplus BTF: where a kernel module's private structures keep a member,
 * read from the type information the kernel publishes for it
 * (/sys/kernel/btf/<module>, split against /sys/kernel/btf/vmlinux), so
 * that the rxe layer need not guess an offset where the kernel says it.
 * Kernels built without module BTF answer -ENOENT and the caller falls
 * back on its checked probes.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/btf.h>
#include <linux/file.h>
#include <linux/fs.h>
#include <linux/slab.h>
#include <linux/string.h>
#include <linux/vmalloc.h>

#include "rdmaplus.h"

#define BTF_MAX_SIZE	(64U << 20)	/* sanity bound for a file we read */

/*
 * The header fields this reader uses. Newer kernels' struct btf_header
 * has more (7.x: a layout section) that files written by an older pahole
 * lack, so hdr_len is checked against this, not against sizeof().
 */
#define BTF_HDR_MIN	offsetofend(struct btf_header, str_len)

/* One BTF file read whole, or vmlinux's header and strings only. */
struct btf_blob {
	void *data;
	size_t size;
	const struct btf_header *hdr;
	const char *strs;
	u32 str_len;
};

static void btf_blob_free(struct btf_blob *b)
{
	vfree(b->data);
	b->data = NULL;
}

static int btf_header_ok(const struct btf_header *h, size_t size)
{
	if (size < BTF_HDR_MIN || h->magic != BTF_MAGIC || h->version != 1 ||
	    h->hdr_len < BTF_HDR_MIN || h->hdr_len > size ||
	    (u64)h->hdr_len + h->type_off + h->type_len > size ||
	    (u64)h->hdr_len + h->str_off + h->str_len > size)
		return -EINVAL;
	return 0;
}

/*
 * Read up to size bytes of path at off into buf (vmalloc'ed here if NULL).
 * A plain read: the BTF files are the kernel's own, not something loaded
 * into it, so this is not a kernel_read_file() (whose LSM hooks, IPE's
 * among them, warn about a read they cannot classify).
 */
static ssize_t btf_pread(const char *path, loff_t off, void **buf,
			 size_t size, size_t *fsize)
{
	struct file *f;
	ssize_t n;
	bool mine = false;

	f = filp_open(path, O_RDONLY, 0);
	if (IS_ERR(f))
		return PTR_ERR(f);
	*fsize = i_size_read(file_inode(f));
	if (!*buf) {
		size = min_t(size_t, size, *fsize);
		*buf = vmalloc(size ? size : 1);
		mine = true;
	}
	/* sysfs hands out at most a page per read */
	for (n = 0; *buf && n < size; ) {
		ssize_t r = kernel_read(f, (u8 *)*buf + n, size - n, &off);

		if (r <= 0) {
			if (r < 0)
				n = r;
			break;
		}
		n += r;
	}
	if (!*buf)
		n = -ENOMEM;
	fput(f);
	if (n < 0 && mine) {
		vfree(*buf);
		*buf = NULL;
	}
	return n;
}

/*
 * Read path whole (a module's BTF is small). The file's size is not
 * trusted (sysfs may report 0): the buffer grows until the end is read.
 */
static int btf_read(const char *path, struct btf_blob *b)
{
	size_t fsize, cap = 256 << 10;
	void *buf;
	ssize_t n;
	int ret;

	for (;;) {
		buf = vmalloc(cap);
		if (!buf)
			return -ENOMEM;
		n = btf_pread(path, 0, &buf, cap, &fsize);
		if (n < 0) {
			vfree(buf);
			return n;
		}
		if (n < cap || cap >= BTF_MAX_SIZE)
			break;
		vfree(buf);
		cap *= 2;
	}
	b->data = buf;
	b->size = n;
	b->hdr = buf;
	ret = btf_header_ok(b->hdr, n);
	if (ret) {
		btf_blob_free(b);
		return ret;
	}
	b->strs = (const char *)buf + b->hdr->hdr_len + b->hdr->str_off;
	b->str_len = b->hdr->str_len;
	return 0;
}

/* vmlinux's strings only: split BTF names refer to them below str_len. */
static int btf_read_base_strings(struct btf_blob *b)
{
	struct btf_header h;
	size_t fsize;
	void *buf;
	ssize_t n;

	buf = &h;
	n = btf_pread("/sys/kernel/btf/vmlinux", 0, &buf, BTF_HDR_MIN, &fsize);
	if (n != BTF_HDR_MIN)
		return n < 0 ? n : -EIO;
	if (btf_header_ok(&h, fsize ? fsize : BTF_MAX_SIZE))
		return -EINVAL;
	buf = vmalloc(h.str_len);
	if (!buf)
		return -ENOMEM;
	n = btf_pread("/sys/kernel/btf/vmlinux", h.hdr_len + h.str_off, &buf,
		      h.str_len, &fsize);
	if (n != h.str_len) {
		vfree(buf);
		return n < 0 ? n : -EIO;
	}
	b->data = buf;
	b->strs = buf;
	b->str_len = h.str_len;
	return 0;
}

/* The name at off of split BTF m over base: NULL if out of bounds. */
static const char *btf_name(const struct btf_blob *base,
			    const struct btf_blob *m, u32 off)
{
	const char *s;
	u32 len;

	if (off < base->str_len) {
		s = base->strs + off;
		len = base->str_len - off;
	} else {
		off -= base->str_len;
		if (off >= m->str_len)
			return NULL;
		s = m->strs + off;
		len = m->str_len - off;
	}
	return strnlen(s, len) < len ? s : NULL;
}

/* Bytes that follow a struct btf_type of this kind and vlen; -1: unknown. */
static long btf_extra(u32 kind, u32 vlen)
{
	switch (kind) {
	case BTF_KIND_INT:
	case BTF_KIND_VAR:
	case BTF_KIND_DECL_TAG:
		return 4;
	case BTF_KIND_ARRAY:
		return sizeof(struct btf_array);
	case BTF_KIND_STRUCT:
	case BTF_KIND_UNION:
		return (long)vlen * sizeof(struct btf_member);
	case BTF_KIND_ENUM:
	case BTF_KIND_FUNC_PROTO:
		return (long)vlen * 8;
	case BTF_KIND_DATASEC:
	case BTF_KIND_ENUM64:
		return (long)vlen * 12;
	case BTF_KIND_PTR:
	case BTF_KIND_FWD:
	case BTF_KIND_TYPEDEF:
	case BTF_KIND_VOLATILE:
	case BTF_KIND_CONST:
	case BTF_KIND_RESTRICT:
	case BTF_KIND_FUNC:
	case BTF_KIND_FLOAT:
	case BTF_KIND_TYPE_TAG:
		return 0;
	default:
		return -1;
	}
}

/*
 * The byte offset of member in struct sname of module's BTF, or -ENOENT
 * (no BTF, no such struct or member), -EINVAL (BTF not understood), or
 * another error reading it. May sleep.
 */
long rdmaplus_btf_offset(const char *module, const char *sname,
			 const char *member)
{
	struct btf_blob base = {}, m = {};
	const u8 *p, *end;
	char path[64];
	long ret;

	snprintf(path, sizeof(path), "/sys/kernel/btf/%s", module);
	ret = btf_read(path, &m);
	if (ret)
		return ret == -EINVAL ? ret : -ENOENT;
	ret = btf_read_base_strings(&base);
	if (ret)
		goto out;
	ret = -ENOENT;
	p = (const u8 *)m.data + m.hdr->hdr_len + m.hdr->type_off;
	end = p + m.hdr->type_len;
	while (p + sizeof(struct btf_type) <= end) {
		const struct btf_type *t = (const void *)p;
		u32 kind = BTF_INFO_KIND(t->info), vlen = BTF_INFO_VLEN(t->info);
		long extra = btf_extra(kind, vlen);
		const struct btf_member *mem;
		const char *name;
		u32 i;

		if (extra < 0 || p + sizeof(*t) + extra > end) {
			ret = -EINVAL;
			break;
		}
		p += sizeof(*t) + extra;
		if (kind != BTF_KIND_STRUCT)
			continue;
		name = btf_name(&base, &m, t->name_off);
		if (!name || strcmp(name, sname))
			continue;
		mem = (const struct btf_member *)(t + 1);
		for (i = 0; i < vlen; i++) {
			u32 bits = BTF_INFO_KFLAG(t->info) ?
				   BTF_MEMBER_BIT_OFFSET(mem[i].offset) :
				   mem[i].offset;

			name = btf_name(&base, &m, mem[i].name_off);
			if (name && !strcmp(name, member) && !(bits % 8)) {
				ret = bits / 8;
				goto out;
			}
		}
		break;		/* the struct has no such member */
	}
out:
	btf_blob_free(&base);
	btf_blob_free(&m);
	return ret;
}
