/* fsync_log.c: an LD_PRELOAD shim for the tests' "power loss" of a Redis server.
 *
 * A crash of the machine (not of the process) keeps of a file what was fsynced and may
 * lose the rest. To play that exactly, this shim records, after every successful
 * fsync/fdatasync, the path and the size the file had when the call began (every byte
 * below it is then on disk): one line "SIZE PATH\n" appended to $FSYNC_LOG. The tests
 * kill the server and cut its append-only file back to the last size recorded for it
 * (tests/aof_tail.py): the worst a power cut can do.
 *
 * Built by the tests with the system C compiler (Debian package gcc); never shipped.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef int (*sync_fn)(int);

static void record(int fd, off_t size) {
    const char *log = getenv("FSYNC_LOG");
    char link[64], path[PATH_MAX], line[PATH_MAX + 32];
    ssize_t n;
    int out, len;
    if (log == NULL) return;
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    n = readlink(link, path, sizeof path - 1);
    if (n <= 0) return;
    path[n] = '\0';
    len = snprintf(line, sizeof line, "%lld %s\n", (long long)size, path);
    out = open(log, O_WRONLY | O_APPEND | O_CREAT, 0644);
    if (out < 0) return;
    if (write(out, line, (size_t)len) < 0) { /* nothing to do: the record is lost */ }
    close(out);
}

static int synced(const char *name, int fd) {
    static sync_fn real_fsync, real_fdatasync;
    sync_fn *slot = strcmp(name, "fsync") == 0 ? &real_fsync : &real_fdatasync;
    struct stat st;
    int have = fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
    int rc;
    if (*slot == NULL) *slot = (sync_fn)dlsym(RTLD_NEXT, name);
    rc = (*slot)(fd);
    if (rc == 0 && have) record(fd, st.st_size);
    return rc;
}

int fsync(int fd) { return synced("fsync", fd); }
int fdatasync(int fd) { return synced("fdatasync", fd); }
