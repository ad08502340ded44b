/*
 * A FUSE passthrough file system for upager's tests (tests/odirect.rs,
 * issue 28 item 4): every call goes to the same path under SOURCE.
 *
 *   passthrough MODE SOURCE MOUNTPOINT [fuse options, e.g. -f]
 *
 * MODE
 *   plain          a plain passthrough;
 *   einval-direct  opens with O_DIRECT are accepted, but read and write on
 *                  a file opened that way fail with EINVAL (what LazyFS
 *                  does); the same file opened without O_DIRECT works.
 *
 * Every refused call prints one line "refused read" / "refused write" on
 * standard error (unbuffered), which the test counts.
 *
 * Build: cc -O2 -Wall -o passthrough passthrough.c $(pkg-config --cflags --libs fuse3)
 * (Debian: libfuse3-dev, and fuse3 for fusermount3; scripts/setup.sh).
 */
#define FUSE_USE_VERSION 31
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <fuse.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

static int source;        /* descriptor of SOURCE */
static int einval_direct; /* MODE einval-direct */

/* A path of the mount, relative to SOURCE. */
static const char *rel(const char *path) {
    while (*path == '/')
        path++;
    return *path ? path : ".";
}

/* A file handle: the backing descriptor, and whether it was opened with
 * O_DIRECT (the low bit). */
static uint64_t handle(int fd, int flags) { return ((uint64_t)fd << 1) | ((flags & O_DIRECT) != 0); }
static int fd_of(const struct fuse_file_info *fi) { return (int)(fi->fh >> 1); }
static int refused(const struct fuse_file_info *fi, const char *what) {
    if (!einval_direct || !(fi->fh & 1))
        return 0;
    fprintf(stderr, "refused %s\n", what);
    return 1;
}

static void *pt_init(struct fuse_conn_info *conn, struct fuse_config *cfg) {
    (void)conn;
    cfg->use_ino = 1;
    /* hard_remove stays off: an unlinked open file (the swap file) keeps a
     * hidden name, so the kernel can open it again by its inode (the store's
     * O_DIRECT descriptor through /proc/self/fd). */
    cfg->nullpath_ok = 1;
    cfg->attr_timeout = 0;   /* sizes seen through the mount are current */
    cfg->entry_timeout = 0;
    return NULL;
}

static int pt_getattr(const char *path, struct stat *st, struct fuse_file_info *fi) {
    int r = fi ? fstat(fd_of(fi), st) : fstatat(source, rel(path), st, AT_SYMLINK_NOFOLLOW);
    return r == 0 ? 0 : -errno;
}

static int pt_readdir(const char *path, void *buf, fuse_fill_dir_t fill, off_t off,
                      struct fuse_file_info *fi, enum fuse_readdir_flags flags) {
    (void)off, (void)fi, (void)flags;
    int fd = openat(source, rel(path), O_RDONLY | O_DIRECTORY);
    if (fd < 0)
        return -errno;
    DIR *d = fdopendir(fd);
    if (!d) {
        close(fd);
        return -errno;
    }
    struct dirent *e;
    while ((e = readdir(d)))
        if (fill(buf, e->d_name, NULL, 0, 0))
            break;
    closedir(d);
    return 0;
}

static int pt_open(const char *path, struct fuse_file_info *fi) {
    /* The backing file is opened without O_DIRECT: the kernel's FUSE side
     * already bypasses its page cache for an O_DIRECT descriptor. */
    int fd = openat(source, rel(path), fi->flags & ~(O_DIRECT | O_CREAT | O_EXCL | O_NOCTTY));
    if (fd < 0)
        return -errno;
    fi->fh = handle(fd, fi->flags);
    return 0;
}

static int pt_create(const char *path, mode_t mode, struct fuse_file_info *fi) {
    int fd = openat(source, rel(path), (fi->flags & ~O_DIRECT) | O_CREAT, mode);
    if (fd < 0)
        return -errno;
    fi->fh = handle(fd, fi->flags);
    return 0;
}

static int pt_read(const char *path, char *buf, size_t size, off_t off, struct fuse_file_info *fi) {
    (void)path;
    if (refused(fi, "read"))
        return -EINVAL;
    size_t done = 0;
    while (done < size) {
        ssize_t n = pread(fd_of(fi), buf + done, size - done, off + (off_t)done);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return done ? (int)done : -errno;
        if (n == 0)
            break;
        done += (size_t)n;
    }
    return (int)done;
}

static int pt_write(const char *path, const char *buf, size_t size, off_t off,
                    struct fuse_file_info *fi) {
    (void)path;
    if (refused(fi, "write"))
        return -EINVAL;
    size_t done = 0;
    while (done < size) {
        ssize_t n = pwrite(fd_of(fi), buf + done, size - done, off + (off_t)done);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return done ? (int)done : -errno;
        done += (size_t)n;
    }
    return (int)done;
}

static int pt_truncate(const char *path, off_t size, struct fuse_file_info *fi) {
    if (fi)
        return ftruncate(fd_of(fi), size) == 0 ? 0 : -errno;
    int fd = openat(source, rel(path), O_WRONLY);
    if (fd < 0)
        return -errno;
    int r = ftruncate(fd, size) == 0 ? 0 : -errno;
    close(fd);
    return r;
}

static int pt_fsync(const char *path, int datasync, struct fuse_file_info *fi) {
    (void)path;
    int r = datasync ? fdatasync(fd_of(fi)) : fsync(fd_of(fi));
    return r == 0 ? 0 : -errno;
}

static int pt_release(const char *path, struct fuse_file_info *fi) {
    (void)path;
    close(fd_of(fi));
    return 0;
}

static int pt_unlink(const char *path) {
    return unlinkat(source, rel(path), 0) == 0 ? 0 : -errno;
}

static int pt_mkdir(const char *path, mode_t mode) {
    return mkdirat(source, rel(path), mode) == 0 ? 0 : -errno;
}

static int pt_rmdir(const char *path) {
    return unlinkat(source, rel(path), AT_REMOVEDIR) == 0 ? 0 : -errno;
}

static int pt_rename(const char *from, const char *to, unsigned int flags) {
    return renameat2(source, rel(from), source, rel(to), flags) == 0 ? 0 : -errno;
}

static int pt_chmod(const char *path, mode_t mode, struct fuse_file_info *fi) {
    int r = fi ? fchmod(fd_of(fi), mode) : fchmodat(source, rel(path), mode, 0);
    return r == 0 ? 0 : -errno;
}

static int pt_utimens(const char *path, const struct timespec tv[2], struct fuse_file_info *fi) {
    int r = fi ? futimens(fd_of(fi), tv) : utimensat(source, rel(path), tv, AT_SYMLINK_NOFOLLOW);
    return r == 0 ? 0 : -errno;
}

static int pt_statfs(const char *path, struct statvfs *st) {
    (void)path;
    return fstatvfs(source, st) == 0 ? 0 : -errno;
}

static const struct fuse_operations ops = {
    .init = pt_init,
    .getattr = pt_getattr,
    .readdir = pt_readdir,
    .open = pt_open,
    .create = pt_create,
    .read = pt_read,
    .write = pt_write,
    .truncate = pt_truncate,
    .fsync = pt_fsync,
    .release = pt_release,
    .unlink = pt_unlink,
    .mkdir = pt_mkdir,
    .rmdir = pt_rmdir,
    .rename = pt_rename,
    .chmod = pt_chmod,
    .utimens = pt_utimens,
    .statfs = pt_statfs,
};

int main(int argc, char **argv) {
    if (argc < 4 || (strcmp(argv[1], "plain") && strcmp(argv[1], "einval-direct"))) {
        fprintf(stderr, "usage: %s plain|einval-direct SOURCE MOUNTPOINT [fuse options]\n", argv[0]);
        return 2;
    }
    setvbuf(stderr, NULL, _IONBF, 0);
    einval_direct = !strcmp(argv[1], "einval-direct");
    source = open(argv[2], O_RDONLY | O_DIRECTORY);
    if (source < 0) {
        perror(argv[2]);
        return 1;
    }
    /* fuse_main sees: program MOUNTPOINT [options]. */
    argv[2] = argv[0];
    return fuse_main(argc - 2, argv + 2, &ops, NULL);
}
