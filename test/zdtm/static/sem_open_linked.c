/*
 * A named POSIX semaphore this process created: glibc creates it as
 * /dev/shm/sem.XXXXXX, maps it, links it to its name and unlinks the
 * temporary name, so the mapping shows in /proc as a deleted file although
 * it is still linked. criu-rocm dumps it by its name (CRIU 4.2.1 asks for
 * --link-remap); after restore the mapping must be the named file and the
 * semaphore keep its value.
 */
#include <fcntl.h>
#include <semaphore.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "zdtmtst.h"

const char *test_doc = "Named semaphore created by the process is restored by its name";
const char *test_author = "criu-rocm";

static int mapped_by_name(const char *file)
{
	char line[4096];
	FILE *f = fopen("/proc/self/maps", "r");
	int found = 0;

	if (!f) {
		pr_perror("open /proc/self/maps");
		return -1;
	}
	while (fgets(line, sizeof(line), f)) {
		char *p = strstr(line, file);

		if (p && (p[strlen(file)] == '\n' || p[strlen(file)] == '\0'))
			found = 1;
	}
	fclose(f);
	return found;
}

int main(int argc, char **argv)
{
	char name[64], file[96];
	sem_t *s;
	int v;

	test_init(argc, argv);

	snprintf(name, sizeof(name), "/zdtm-sem-linked-%d", getpid());
	snprintf(file, sizeof(file), "/dev/shm/sem.%s", name + 1);
	sem_unlink(name);
	s = sem_open(name, O_CREAT | O_EXCL, 0600, 3);
	if (s == SEM_FAILED) {
		pr_perror("sem_open %s", name);
		return 1;
	}
	if (sem_wait(s)) {
		pr_perror("sem_wait");
		goto out;
	}

	test_daemon();
	test_waitsig();

	if (sem_getvalue(s, &v)) {
		fail("sem_getvalue");
		goto out;
	}
	if (v != 2) {
		fail("semaphore value %d, expected 2", v);
		goto out;
	}
	if (mapped_by_name(file) != 1) {
		fail("%s is not mapped by its name", file);
		goto out;
	}
	if (sem_post(s) || sem_getvalue(s, &v) || v != 3) {
		fail("semaphore does not count after restore (%d)", v);
		goto out;
	}
	sem_unlink(name);
	pass();
	return 0;
out:
	sem_unlink(name);
	return 1;
}
