// SPDX-License-Identifier: GPL-2.0-only
/*
 * Render nodes at their own paths: a container restored onto other GPUs
 * than it was dumped with, given them the way Kubernetes' AMD device plugin
 * gives them (host /dev/dri/renderD130 is /dev/dri/renderD130 inside).
 *
 * Engines declare each bind mount of a container as an external mount keyed
 * by its destination (runc, crun: `mnt[/dev/dri/renderD128]`), at dump and
 * again at restore from the new container's configuration.  The image's
 * mount tree still holds the dumped container's nodes, renderD128 and
 * renderD129, for which the restore names no source, and the restore names
 * renderD130 and renderD131, which no mount of the image holds.  Every other
 * mount without a source stays CRIU's error; for render nodes, the mounts
 * without a source take the render nodes the restore names and the image
 * does not hold, one for one in minor order, at the new nodes' own paths,
 * and their mount points follow in the restored parent file system.  Which
 * old node becomes which new one does not matter: the restored task finds
 * its GPUs among the render nodes it has, by identity (RESTORE_EXT_FILE),
 * and criu-rocm's topology match picks the GPU for each of the image's.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/list.h"
#include "cr_options.h"
#include "external.h"
#include "log.h"
#include "mount.h"
#include "util.h"
#include "xmalloc.h"
#include "criu-rocm.h"

#undef LOG_PREFIX
#define LOG_PREFIX "criu-rocm: "

#define RENDER_PREFIX "/dev/dri/renderD"

/* An image mount of a render node, or a render node the restore names. */
struct render_node {
	struct list_head l;
	unsigned int minor;
	struct mount_info *mi;		/* image mount without a source (NULL: a node the restore names) */
	const char *val;		/* the restore's source of the node */
	char *old_ns_mountpoint;	/* after placing: where the image had it */
};

static LIST_HEAD(unmapped);	/* image mounts without a source */
static LIST_HEAD(placed);	/* ... once given a node of the restore */
/* The render-node keys the image's mounts hold that the restore maps. */
static unsigned int *claimed;
static size_t nr_claimed;

/* The minor of `/dev/dri/renderD<N>`; false for any other path. */
static bool render_key_minor(const char *key, unsigned int *minor)
{
	int end = 0;

	if (strncmp(key, RENDER_PREFIX, strlen(RENDER_PREFIX)))
		return false;
	/* Digits only: sscanf's %u would also take blanks and a sign. */
	if (key[strlen(RENDER_PREFIX)] < '0' || key[strlen(RENDER_PREFIX)] > '9')
		return false;
	if (sscanf(key + strlen(RENDER_PREFIX), "%u%n", minor, &end) != 1)
		return false;
	return key[strlen(RENDER_PREFIX) + end] == '\0' && end > 0;
}

static bool ends_with(const char *s, const char *suffix)
{
	size_t n = strlen(s), k = strlen(suffix);

	return n >= k && !strcmp(s + n - k, suffix);
}

/* Inserts n into head, ordered by minor. */
static void add_by_minor(struct list_head *head, struct render_node *n)
{
	struct render_node *pos;

	list_for_each_entry(pos, head, l) {
		if (pos->minor > n->minor) {
			list_add_tail(&n->l, &pos->l);
			return;
		}
	}
	list_add_tail(&n->l, head);
}

int criu_rocm_collect_render_mount(struct mount_info *mi, const char *key, const char *ext)
{
	struct render_node *n;
	unsigned int minor;

	if (!render_key_minor(key, &minor))
		return 0;
	if (ext) {
		if (xrealloc_safe(&claimed, (nr_claimed + 1) * sizeof(*claimed)))
			return -1;
		claimed[nr_claimed++] = minor;
		return 0;
	}
	n = xzalloc(sizeof(*n));
	if (!n)
		return -1;
	n->minor = minor;
	n->mi = mi;
	add_by_minor(&unmapped, n);
	return 1;
}

static bool is_claimed(unsigned int minor)
{
	size_t i;

	for (i = 0; i < nr_claimed; i++)
		if (claimed[i] == minor)
			return true;
	return false;
}

/* external_for_each_type("mnt") callback: the render nodes no image mount holds. */
static int collect_offered(struct external *e, void *arg)
{
	struct list_head *offered = arg;
	char key[PATH_MAX], *end;
	struct render_node *n;
	unsigned int minor;
	const char *val = external_val(e);

	end = strchr(e->id, ']');
	if (!val || !end || end - e->id - 4 >= (long)sizeof(key))
		return 0;
	snprintf(key, sizeof(key), "%.*s", (int)(end - e->id - 4), e->id + 4);
	if (!render_key_minor(key, &minor) || is_claimed(minor))
		return 0;
	n = xzalloc(sizeof(*n));
	if (!n)
		return -1;
	n->minor = minor;
	n->val = val;
	add_by_minor(offered, n);
	return 0;
}

static void list_minors(char *buf, size_t size, struct list_head *head)
{
	struct render_node *n;
	size_t off = 0;

	buf[0] = '\0';
	list_for_each_entry(n, head, l) {
		if (off >= size)
			break;
		off += snprintf(buf + off, size - off, "%srenderD%u", off ? " " : "", n->minor);
	}
}

/* Moves mount mi from `.../renderD<old>` to the path of `to`, whose source it takes. */
static int place_one(struct render_node *from, struct render_node *to)
{
	struct mount_info *mi = from->mi;
	size_t ns_off = mi->ns_mountpoint - mi->mountpoint;
	char old_key[64], new_key[64];
	char *mp;
	int keep;

	snprintf(old_key, sizeof(old_key), RENDER_PREFIX "%u", from->minor);
	snprintf(new_key, sizeof(new_key), RENDER_PREFIX "%u", to->minor);
	if (!ends_with(mi->ns_mountpoint, old_key)) {
		pr_err("mount %d at %s holds render node %s under another path: cannot place it at %s\n",
		       mi->mnt_id, mi->ns_mountpoint, old_key, new_key);
		return -1;
	}
	from->old_ns_mountpoint = xstrdup(mi->ns_mountpoint);
	keep = strlen(mi->mountpoint) - strlen(old_key);
	mp = xsprintf("%.*s%s", keep, mi->mountpoint, new_key);
	if (!from->old_ns_mountpoint || !mp)
		return -1;
	xfree(mi->mountpoint);
	mi->mountpoint = mp;
	mi->ns_mountpoint = mp + ns_off;
	mi->external = (char *)to->val;
	pr_info("mount %d: the image's render node %s becomes %s (from %s), as the restore gives the container\n",
		mi->mnt_id, old_key, new_key, to->val);
	return 0;
}

static size_t count(struct list_head *head)
{
	struct list_head *pos;
	size_t n = 0;

	list_for_each(pos, head)
		n++;
	return n;
}

int criu_rocm_place_render_mounts(void)
{
	struct render_node *from, *to, *tmp;
	LIST_HEAD(offered);
	char had[256], got[256];
	int ret = -1;

	if (list_empty(&unmapped))
		return 0;
	if (external_for_each_type("mnt", collect_offered, &offered))
		goto out;
	if (count(&unmapped) != count(&offered)) {
		list_minors(had, sizeof(had), &unmapped);
		list_minors(got, sizeof(got), &offered);
		pr_err("the image's render-node mounts %s have no source in this restore, and the restore "
		       "gives the container %s%s instead: a container restored onto other GPUs must be "
		       "given as many render nodes as it was dumped with\n",
		       had, list_empty(&offered) ? "no other render node" : "the render nodes ", got);
		goto out;
	}
	list_for_each_entry_safe(from, tmp, &unmapped, l) {
		to = list_first_entry(&offered, struct render_node, l);
		if (place_one(from, to))
			goto out;
		list_del(&to->l);
		xfree(to);
		list_move_tail(&from->l, &placed);
	}
	ret = 0;
out:
	list_for_each_entry_safe(to, tmp, &offered, l) {
		list_del(&to->l);
		xfree(to);
	}
	return ret;
}

/*
 * The mount point a placed mount needs in its restored parent: the engine
 * made a file for the old node (runc and crun create bind-mount targets in
 * the container's /dev tmpfs), which CRIU restored with the tmpfs; it is
 * renamed to the new node's name, or made when it is missing.
 */
int criu_rocm_render_mountpoints(struct mount_info *parent, const char *root)
{
	struct render_node *n;

	list_for_each_entry(n, &placed, l) {
		char *rel_old, *rel_new, old[PATH_MAX], new[PATH_MAX];
		struct stat st;
		int fd;

		if (n->mi->parent != parent)
			continue;
		rel_old = get_relative_path(n->old_ns_mountpoint, parent->ns_mountpoint);
		rel_new = get_relative_path(n->mi->ns_mountpoint, parent->ns_mountpoint);
		if (!rel_old || !rel_new)
			continue;
		snprintf(old, sizeof(old), "%s/%s", root, rel_old);
		snprintf(new, sizeof(new), "%s/%s", root, rel_new);
		if (!lstat(new, &st))
			continue;
		if (!lstat(old, &st) && !S_ISDIR(st.st_mode)) {
			if (rename(old, new)) {
				pr_perror("cannot rename mount point %s to %s", old, new);
				return -1;
			}
			continue;
		}
		fd = open(new, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
		if (fd < 0) {
			pr_perror("cannot create mount point %s", new);
			return -1;
		}
		close(fd);
	}
	return 0;
}
