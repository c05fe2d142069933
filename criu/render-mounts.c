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
 *
 * On hardware the nodes are not mounts: runc makes the container's devices
 * with mknod in its /dev tmpfs, which CRIU restores as dumped, old minors
 * and all, and runc names the new container's devices as external mounts
 * that no image mount holds.  After such a tmpfs is restored, its render
 * nodes the restore does not name are replaced, one for one in minor order,
 * by the named nodes it lacks: character devices of their sources' rdev,
 * with the old nodes' mode and owner.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
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
#define DRM_MAJOR 226
/* A restore naming more render nodes than this is refused (a host has a few dozen). */
#define MAX_NODES 128

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
static LIST_HEAD(spare);	/* render nodes the restore names that no image mount took */
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
	char had[256], got[256];

	if (external_for_each_type("mnt", collect_offered, &spare))
		return -1;
	if (list_empty(&unmapped))
		return 0;
	if (count(&unmapped) != count(&spare)) {
		list_minors(had, sizeof(had), &unmapped);
		list_minors(got, sizeof(got), &spare);
		pr_err("the image's render-node mounts %s have no source in this restore, and the restore "
		       "gives the container %s%s instead: a container restored onto other GPUs must be "
		       "given as many render nodes as it was dumped with\n",
		       had, list_empty(&spare) ? "no other render node" : "the render nodes ", got);
		return -1;
	}
	list_for_each_entry_safe(from, tmp, &unmapped, l) {
		to = list_first_entry(&spare, struct render_node, l);
		if (place_one(from, to))
			return -1;
		list_del(&to->l);
		xfree(to);
		list_move_tail(&from->l, &placed);
	}
	return 0;
}

/*
 * The mount point a placed mount needs in its restored parent: the engine
 * made a file for the old node (runc and crun create bind-mount targets in
 * the container's /dev tmpfs), which CRIU restored with the tmpfs; it is
 * renamed to the new node's name, or made when it is missing.
 */
static int place_mountpoints(struct mount_info *parent, const char *root)
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

/* Where render node `minor` is inside the file system of parent (at root); false: not in it. */
static bool node_path(struct mount_info *parent, const char *root, unsigned int minor, char *buf, size_t size)
{
	char key[64];
	const char *mp = parent->ns_mountpoint;
	size_t len;

	if (mp[0] == '.')
		mp++;
	len = strlen(mp);
	while (len && mp[len - 1] == '/')
		len--;
	snprintf(key, sizeof(key), RENDER_PREFIX "%u", minor);
	if (strncmp(key, mp, len) || key[len] != '/')
		return false;
	return snprintf(buf, size, "%s%s", root, key + len) < (int)size;
}

/* Whether the restore names render node `minor` (as an external mount, with a source or not). */
static bool restore_names(unsigned int minor)
{
	char key[80];

	snprintf(key, sizeof(key), "mnt[" RENDER_PREFIX "%u]", minor);
	return !IS_ERR(external_lookup_by_key(key));
}

/*
 * The restored tmpfs' render nodes in the directory of `dir` (a path below
 * root) that the restore does not name: character devices of the DRM major
 * named renderD<N>, in minor order.
 */
static int stale_nodes(const char *dir, unsigned int *minors, int max)
{
	struct dirent *de;
	int n = 0, i, j;
	DIR *d;

	d = opendir(dir);
	if (!d)
		return 0;
	while ((de = readdir(d))) {
		char path[PATH_MAX], key[64];
		unsigned int minor;
		struct stat st;

		if (snprintf(key, sizeof(key), "/dev/dri/%s", de->d_name) >= (int)sizeof(key) ||
		    snprintf(path, sizeof(path), "%s/%s", dir, de->d_name) >= (int)sizeof(path))
			continue;
		if (!render_key_minor(key, &minor) || lstat(path, &st) || !S_ISCHR(st.st_mode) ||
		    major(st.st_rdev) != DRM_MAJOR || restore_names(minor))
			continue;
		if (n == max) {
			closedir(d);
			pr_err("more than %d render nodes in %s\n", max, dir);
			return -1;
		}
		for (i = 0; i < n && minors[i] < minor; i++)
			;
		for (j = n; j > i; j--)
			minors[j] = minors[j - 1];
		minors[i] = minor;
		n++;
	}
	closedir(d);
	return n;
}

/*
 * Replaces render node `from` at old by node `to` at new, of the rdev of
 * src, with old's mode and owner.
 */
static int replace_node(unsigned int from, const char *old, unsigned int to, const char *new, const char *src)
{
	struct stat ost, sst;

	if (lstat(old, &ost) || stat(src, &sst)) {
		pr_perror("cannot stat render node %s or its source %s", old, src);
		return -1;
	}
	if (!S_ISCHR(sst.st_mode)) {
		pr_err("the restore names %s as the source of %s, which is no character device\n", src, new);
		return -1;
	}
	if (mknod(new, S_IFCHR | (ost.st_mode & 07777), sst.st_rdev) || chown(new, ost.st_uid, ost.st_gid) ||
	    unlink(old)) {
		pr_perror("cannot replace device node %s by %s (%u:%u)", old, new, major(sst.st_rdev),
			  minor(sst.st_rdev));
		return -1;
	}
	pr_info("device node " RENDER_PREFIX "%u (%u:%u) of the image becomes " RENDER_PREFIX
		"%u (%u:%u, from %s), as the restore gives the container\n",
		from, major(ost.st_rdev), minor(ost.st_rdev), to, major(sst.st_rdev), minor(sst.st_rdev), src);
	return 0;
}

/* The spare nodes this restored tmpfs lacks take the place of its stale ones. */
static int replace_device_nodes(struct mount_info *parent, const char *root)
{
	struct render_node *want[MAX_NODES], *n;
	unsigned int stale[MAX_NODES];
	char path[PATH_MAX], dir[PATH_MAX], old[PATH_MAX];
	int nr_want = 0, nr_stale, i;
	struct stat st;

	list_for_each_entry(n, &spare, l) {
		if (!node_path(parent, root, n->minor, path, sizeof(path)) || !lstat(path, &st))
			continue;
		if (nr_want == MAX_NODES) {
			pr_err("the restore names more than %d render nodes\n", MAX_NODES);
			return -1;
		}
		want[nr_want++] = n;
	}
	if (!nr_want)
		return 0;
	node_path(parent, root, want[0]->minor, dir, sizeof(dir));
	*strrchr(dir, '/') = '\0';
	nr_stale = stale_nodes(dir, stale, MAX_NODES);
	if (nr_stale <= 0)
		return nr_stale;
	if (nr_stale != nr_want) {
		pr_err("the restored %s holds %d render node(s) the restore does not name and lacks %d it "
		       "names: a container restored onto other GPUs must be given as many as it was dumped with\n",
		       dir, nr_stale, nr_want);
		return -1;
	}
	for (i = 0; i < nr_want; i++) {
		if (snprintf(old, sizeof(old), "%s/renderD%u", dir, stale[i]) >= (int)sizeof(old) ||
		    !node_path(parent, root, want[i]->minor, path, sizeof(path))) {
			pr_err("render node path too long in %s\n", dir);
			return -1;
		}
		if (replace_node(stale[i], old, want[i]->minor, path, want[i]->val))
			return -1;
	}
	return 0;
}

int criu_rocm_render_mountpoints(struct mount_info *parent, const char *root)
{
	if (place_mountpoints(parent, root))
		return -1;
	return replace_device_nodes(parent, root);
}
