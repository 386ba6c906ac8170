/*
 * accelshare-exec: how a process-runtime kernel's command is started, without Python.
 *
 * Built by the agent at start (accelshare/agent/runtime/exec_helper.py), statically
 * where the C library allows.  One binary, two modes:
 *
 *   accelshare-exec enter ERR_FD ENV_FD [--procs FILE]... [--rlimit NAME SOFT HARD]...
 *                   [--cpus N,N,...] [--keep-fd N]... --log FILE --cwd DIR -- PROGRAM ARG...
 *
 *     The kernel's process, started by its supervisor (_launcher.py) with posix_spawn:
 *     its own session, every signal's default and none blocked, an empty environment.
 *     It reads the kernel's environment from ENV_FD ("KEY=VALUE" entries, each ended by
 *     a NUL byte, up to EOF), writes its pid into every cgroup.procs FILE (it joins the
 *     kernel's cgroups before the command runs), sets each rlimit (SOFT/HARD: a number,
 *     -1 for none) and its CPU affinity, takes /dev/null as stdin and appends stdout and
 *     stderr to the kernel's log, changes to DIR, closes every descriptor but 0-2 and
 *     the --keep-fd ones (bubblewrap's), and execs PROGRAM with the kernel's environment,
 *     looking it up on that environment's PATH as Python's os.execvpe does.  Any failure
 *     is written to ERR_FD (close-on-exec: EOF tells the supervisor the exec succeeded)
 *     as Python's "TypeName: message", and the helper exits 127.
 *
 *   accelshare-exec drop UID GID ENV_FD -- PROGRAM ARG...
 *
 *     Inside a sandbox started by root (sandbox.py): reads the kernel's environment
 *     from ENV_FD (as enter does; its own is bwrap's fixed one), drops to UID/GID for
 *     good, as setpriv --reuid=UID --regid=GID --clear-groups --inh-caps=-all
 *     --bounding-set=-all does: no supplementary groups, no capabilities in any set
 *     (bounding, ambient, inheritable, permitted, effective), and only then execs
 *     PROGRAM with the kernel's environment, looked up on its PATH as enter does.
 *     Nothing of the kernel's environment is in this process's own: a dynamically
 *     linked build (no static C library) loads nothing a session names.  Failures go
 *     to stderr (the kernel's log); the exit code is 126, or 127 when PROGRAM is not
 *     found.
 *
 *   accelshare-exec env ENV_FD -- PROGRAM ARG...
 *
 *     The same without a change of user (a sandbox of an agent that is not root, a
 *     terminal nsenter has already moved to the kernel's user): the kernel's
 *     environment from ENV_FD, then PROGRAM with it.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <linux/capability.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef PR_CAP_AMBIENT
#define PR_CAP_AMBIENT 47
#define PR_CAP_AMBIENT_CLEAR_ALL 4
#endif

#define MAX_LIST 256

static int err_fd = -1;

/* Python's exception class for an errno (PEP 3151). */
static const char *error_type(int e) {
    switch (e) {
    case EAGAIN: case EALREADY: case EINPROGRESS: return "BlockingIOError";
    case ECHILD: return "ChildProcessError";
    case EPIPE: case ESHUTDOWN: return "BrokenPipeError";
    case ECONNABORTED: return "ConnectionAbortedError";
    case ECONNREFUSED: return "ConnectionRefusedError";
    case ECONNRESET: return "ConnectionResetError";
    case EEXIST: return "FileExistsError";
    case ENOENT: return "FileNotFoundError";
    case EINTR: return "InterruptedError";
    case EISDIR: return "IsADirectoryError";
    case ENOTDIR: return "NotADirectoryError";
    case EACCES: case EPERM: return "PermissionError";
    case ESRCH: return "ProcessLookupError";
    case ETIMEDOUT: return "TimeoutError";
    default: return "OSError";
    }
}

static void write_all(int fd, const char *text, size_t len) {
    while (len > 0) {
        ssize_t n = write(fd, text, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return;
        text += n;
        len -= (size_t)n;
    }
}

/* Report "TypeName: message" (enter mode: to ERR_FD; drop mode: to stderr) and exit. */
static void fail(int code, const char *type, const char *format, ...) {
    char message[4096];
    int used = snprintf(message, sizeof message, "%s: ", type);
    va_list args;
    va_start(args, format);
    if (used > 0 && (size_t)used < sizeof message)
        vsnprintf(message + used, sizeof message - (size_t)used, format, args);
    va_end(args);
    if (err_fd >= 0) {
        write_all(err_fd, message, strlen(message));
    } else {
        write_all(2, "accelshare-exec: ", 17);
        write_all(2, message, strlen(message));
        write_all(2, "\n", 1);
    }
    _exit(code);
}

/* An OSError as Python words it: "[Errno N] text: 'file'". */
static void fail_os(int code, int e, const char *file) {
    if (file != NULL)
        fail(code, error_type(e), "[Errno %d] %s: '%s'", e, strerror(e), file);
    fail(code, error_type(e), "[Errno %d] %s", e, strerror(e));
}

static void usage(const char *why) { fail(127, "ValueError", "accelshare-exec: %s", why); }

/* A whole decimal number within [low, high], else usage(). */
static long long parse_number(const char *text, long long low, long long high, const char *what) {
    char *end = NULL;
    if (text == NULL || *text == '\0')
        usage(what);
    errno = 0;
    long long value = strtoll(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || value < low || value > high)
        usage(what);
    return value;
}

static int parse_fd(const char *text) { return (int)parse_number(text, 0, INT_MAX, "bad descriptor"); }

struct limit_name {
    const char *name;
    int resource;
};

static const struct limit_name LIMITS[] = {
    {"RLIMIT_AS", RLIMIT_AS},         {"RLIMIT_CORE", RLIMIT_CORE},
    {"RLIMIT_CPU", RLIMIT_CPU},       {"RLIMIT_DATA", RLIMIT_DATA},
    {"RLIMIT_FSIZE", RLIMIT_FSIZE},   {"RLIMIT_LOCKS", RLIMIT_LOCKS},
    {"RLIMIT_MEMLOCK", RLIMIT_MEMLOCK}, {"RLIMIT_MSGQUEUE", RLIMIT_MSGQUEUE},
    {"RLIMIT_NICE", RLIMIT_NICE},     {"RLIMIT_NOFILE", RLIMIT_NOFILE},
    {"RLIMIT_NPROC", RLIMIT_NPROC},   {"RLIMIT_RSS", RLIMIT_RSS},
    {"RLIMIT_RTPRIO", RLIMIT_RTPRIO}, {"RLIMIT_RTTIME", RLIMIT_RTTIME},
    {"RLIMIT_SIGPENDING", RLIMIT_SIGPENDING}, {"RLIMIT_STACK", RLIMIT_STACK},
};

static int limit_resource(const char *name) {
    for (size_t i = 0; i < sizeof LIMITS / sizeof LIMITS[0]; i++)
        if (strcmp(LIMITS[i].name, name) == 0)
            return LIMITS[i].resource;
    fail(127, "AttributeError", "module 'resource' has no attribute '%s'", name);
    return -1;
}

static rlim_t limit_value(const char *text) {
    long long value = parse_number(text, -1, LLONG_MAX, "bad rlimit value");
    return value == -1 ? RLIM_INFINITY : (rlim_t)value;
}

/* The kernel's environment: NUL-ended "KEY=VALUE" entries read from fd up to EOF. */
static char **read_environment(int fd) {
    size_t size = 0, capacity = 65536;
    char *data = malloc(capacity);
    if (data == NULL)
        fail_os(127, ENOMEM, NULL);
    for (;;) {
        if (size == capacity) {
            if (capacity > (size_t)64 << 20)
                fail(127, "ValueError", "the kernel's environment is larger than 64 MiB");
            capacity *= 2;
            char *grown = realloc(data, capacity);
            if (grown == NULL)
                fail_os(127, ENOMEM, NULL);
            data = grown;
        }
        ssize_t n = read(fd, data + size, capacity - size);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            fail_os(127, errno, NULL);
        if (n == 0)
            break;
        size += (size_t)n;
    }
    close(fd);
    if (size > 0 && data[size - 1] != '\0')
        fail(127, "ValueError", "the kernel's environment does not end with a NUL byte");
    size_t count = 0;
    for (size_t i = 0; i < size; i++)
        count += data[i] == '\0';
    char **env = calloc(count + 1, sizeof *env);
    if (env == NULL)
        fail_os(127, ENOMEM, NULL);
    size_t k = 0;
    for (size_t i = 0; i < size; i += strlen(data + i) + 1) {
        const char *eq = strchr(data + i, '=');
        if (eq == NULL || eq == data + i)
            fail(127, "ValueError", "illegal environment variable name");
        env[k++] = data + i;
    }
    return env;
}

static const char *env_get(char **env, const char *key) {
    size_t len = strlen(key);
    for (; *env != NULL; env++)
        if (strncmp(*env, key, len) == 0 && (*env)[len] == '=')
            return *env + len + 1;
    return NULL;
}

static void write_pid(const char *procs_file) {
    char pid[32];
    int len = snprintf(pid, sizeof pid, "%d", (int)getpid());
    int fd = open(procs_file, O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        fail_os(127, errno, procs_file);
    if (write(fd, pid, (size_t)len) != len)
        fail_os(127, errno, procs_file);
    close(fd);
}

static void set_affinity(const char *list) {
    int cpus[MAX_LIST * 4];
    int count = 0, highest = 0;
    char *copy = strdup(list), *save = NULL;
    if (copy == NULL)
        fail_os(127, ENOMEM, NULL);
    for (char *item = strtok_r(copy, ",", &save); item != NULL; item = strtok_r(NULL, ",", &save)) {
        if (count == (int)(sizeof cpus / sizeof cpus[0]))
            usage("too many CPUs");
        cpus[count] = (int)parse_number(item, 0, 1 << 20, "bad CPU number");
        if (cpus[count] > highest)
            highest = cpus[count];
        count++;
    }
    free(copy);
    if (count == 0)
        usage("no CPU in --cpus");
    cpu_set_t *set = CPU_ALLOC((size_t)highest + 1);
    size_t set_size = CPU_ALLOC_SIZE((size_t)highest + 1);
    if (set == NULL)
        fail_os(127, ENOMEM, NULL);
    CPU_ZERO_S(set_size, set);
    for (int i = 0; i < count; i++)
        CPU_SET_S((size_t)cpus[i], set_size, set);
    if (sched_setaffinity(0, set_size, set) != 0)
        fail_os(127, errno, NULL);
    CPU_FREE(set);
}

static int kept(int fd, const int *keep, int keep_count) {
    if (fd <= 2 || fd == err_fd)
        return 1;
    for (int i = 0; i < keep_count; i++)
        if (keep[i] == fd)
            return 1;
    return 0;
}

/* Close every descriptor but 0-2, ERR_FD and the kept ones (those lose close-on-exec). */
static void close_others(const int *keep, int keep_count) {
    for (int i = 0; i < keep_count; i++)
        if (fcntl(keep[i], F_SETFD, 0) != 0)
            fail_os(127, errno, NULL);
    DIR *dir = opendir("/proc/self/fd");
    if (dir == NULL) {
        struct rlimit files;
        long highest = getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur != RLIM_INFINITY
                           ? (long)files.rlim_cur
                           : 65536;
        for (long fd = 3; fd < highest && fd < 1048576; fd++)
            if (!kept((int)fd, keep, keep_count))
                close((int)fd);
        return;
    }
    int own = dirfd(dir);
    int found[4096];
    int count;
    do { /* (closing while reading the listing: read a batch, close it, read again) */
        count = 0;
        rewinddir(dir);
        struct dirent *entry;
        while ((entry = readdir(dir)) != NULL && count < (int)(sizeof found / sizeof found[0])) {
            if (entry->d_name[0] < '0' || entry->d_name[0] > '9')
                continue;
            int fd = atoi(entry->d_name);
            if (fd != own && !kept(fd, keep, keep_count))
                found[count++] = fd;
        }
        for (int i = 0; i < count; i++)
            close(found[i]);
    } while (count > 0);
    closedir(dir);
}

/* The exit code of a failed exec: enter mode always 127 (the supervisor reads the
 * error from ERR_FD); drop and env modes 127 when the program is not there, else 126
 * (as setpriv and env(1) say it). */
static int exec_code(int e) {
    if (err_fd >= 0)
        return 127;
    return e == ENOENT ? 127 : 126;
}

/* execve PROGRAM, searched on the kernel environment's PATH as os.execvpe does: the
 * first error other than "not found" wins, else the last one. */
static void exec_search(char **argv, char **env) {
    const char *file = argv[0];
    if (strchr(file, '/') != NULL) {
        execve(file, argv, env);
        fail_os(exec_code(errno), errno, file);
    }
    const char *path = env_get(env, "PATH");
    if (path == NULL)
        path = "/bin:/usr/bin"; /* (Python's os.defpath) */
    int saved = 0, last = ENOENT;
    char saved_name[PATH_MAX], last_name[PATH_MAX];
    saved_name[0] = last_name[0] = '\0';
    for (const char *dir = path;; dir++) {
        const char *end = strchrnul(dir, ':');
        size_t dir_len = (size_t)(end - dir);
        char full[PATH_MAX];
        int n;
        if (dir_len == 0)
            n = snprintf(full, sizeof full, "%s", file);
        else if (dir[dir_len - 1] == '/')
            n = snprintf(full, sizeof full, "%.*s%s", (int)dir_len, dir, file);
        else
            n = snprintf(full, sizeof full, "%.*s/%s", (int)dir_len, dir, file);
        if (n > 0 && (size_t)n < sizeof full) {
            execve(full, argv, env);
            int e = errno;
            last = e;
            memcpy(last_name, full, (size_t)n + 1);
            if (e != ENOENT && e != ENOTDIR && saved == 0) {
                saved = e;
                memcpy(saved_name, full, (size_t)n + 1);
            }
        }
        if (*end == '\0')
            break;
        dir = end;
    }
    if (saved != 0)
        fail_os(exec_code(saved), saved, saved_name);
    fail_os(exec_code(last), last, last_name[0] ? last_name : file);
}

static int enter(int argc, char **argv) {
    if (argc < 4)
        usage("enter ERR_FD ENV_FD ... -- PROGRAM ARG...");
    err_fd = parse_fd(argv[2]);
    if (fcntl(err_fd, F_SETFD, FD_CLOEXEC) != 0) {
        int e = errno;
        err_fd = -1;
        fail_os(127, e, NULL);
    }
    int env_fd = parse_fd(argv[3]);
    const char *procs[MAX_LIST], *log_file = NULL, *cwd = NULL, *cpus = NULL;
    int procs_count = 0, keep[MAX_LIST], keep_count = 0;
    int resources[MAX_LIST], limit_count = 0;
    rlim_t soft[MAX_LIST], hard[MAX_LIST];
    int i = 4;
    for (; i < argc; i++) {
        const char *option = argv[i];
        int left = argc - i - 1;
        if (strcmp(option, "--") == 0) {
            i++;
            break;
        } else if (strcmp(option, "--procs") == 0 && left >= 1) {
            if (procs_count == MAX_LIST)
                usage("too many --procs");
            procs[procs_count++] = argv[++i];
        } else if (strcmp(option, "--rlimit") == 0 && left >= 3) {
            if (limit_count == MAX_LIST)
                usage("too many --rlimit");
            resources[limit_count] = limit_resource(argv[i + 1]);
            soft[limit_count] = limit_value(argv[i + 2]);
            hard[limit_count] = limit_value(argv[i + 3]);
            limit_count++;
            i += 3;
        } else if (strcmp(option, "--cpus") == 0 && left >= 1) {
            cpus = argv[++i];
        } else if (strcmp(option, "--keep-fd") == 0 && left >= 1) {
            if (keep_count == MAX_LIST)
                usage("too many --keep-fd");
            keep[keep_count++] = parse_fd(argv[++i]);
        } else if (strcmp(option, "--log") == 0 && left >= 1) {
            log_file = argv[++i];
        } else if (strcmp(option, "--cwd") == 0 && left >= 1) {
            cwd = argv[++i];
        } else {
            usage("unknown option, or one without its value");
        }
    }
    if (log_file == NULL || cwd == NULL)
        usage("--log and --cwd are required");
    if (i >= argc || argv[i][0] == '\0')
        usage("no PROGRAM after --");
    char **env = read_environment(env_fd);
    for (int k = 0; k < procs_count; k++)
        write_pid(procs[k]);
    for (int k = 0; k < limit_count; k++) {
        struct rlimit limit = {soft[k], hard[k]};
        if (setrlimit(resources[k], &limit) != 0) {
            if (errno == EPERM)
                fail(127, "ValueError", "not allowed to raise maximum limit");
            if (errno == EINVAL)
                fail(127, "ValueError", "current limit exceeds maximum limit");
            fail_os(127, errno, NULL);
        }
    }
    if (cpus != NULL)
        set_affinity(cpus);
    int stdin_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (stdin_fd < 0)
        fail_os(127, errno, "/dev/null");
    int log_fd = open(log_file, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (log_fd < 0)
        fail_os(127, errno, log_file);
    if (dup2(stdin_fd, 0) < 0 || dup2(log_fd, 1) < 0 || dup2(log_fd, 2) < 0)
        fail_os(127, errno, NULL);
    if (chdir(cwd) != 0)
        fail_os(127, errno, cwd);
    close_others(keep, keep_count);
    exec_search(argv + i, env);
    return 127;
}

static int drop(int argc, char **argv) {
    if (argc < 7 || strcmp(argv[5], "--") != 0 || argv[6][0] == '\0')
        usage("drop UID GID ENV_FD -- PROGRAM ARG...");
    uid_t uid = (uid_t)parse_number(argv[2], 0, 0xfffffffeLL, "bad UID");
    gid_t gid = (gid_t)parse_number(argv[3], 0, 0xfffffffeLL, "bad GID");
    char **env = read_environment(parse_fd(argv[4]));
    if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0 && errno != EINVAL)
        fail_os(126, errno, NULL);
    for (int cap = 0; cap < 64; cap++) {
        int held = prctl(PR_CAPBSET_READ, cap, 0, 0, 0);
        if (held < 0)
            break; /* past the kernel's last capability */
        if (held > 0 && prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0)
            fail_os(126, errno, NULL);
    }
    if (setgroups(0, NULL) != 0)
        fail_os(126, errno, NULL);
    if (setresgid(gid, gid, gid) != 0)
        fail_os(126, errno, NULL);
    if (setresuid(uid, uid, uid) != 0)
        fail_os(126, errno, NULL);
    struct __user_cap_header_struct header = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct none[2];
    memset(none, 0, sizeof none);
    if (syscall(SYS_capset, &header, none) != 0)
        fail_os(126, errno, NULL);
    uid_t r, e, s;
    if (uid != 0 && (getresuid(&r, &e, &s) != 0 || r != uid || e != uid || s != uid ||
                     setresuid(0, 0, 0) == 0))
        fail(126, "PermissionError", "the user did not change for good");
    exec_search(argv + 6, env);
    return 126;
}

static int apply_env(int argc, char **argv) {
    if (argc < 5 || strcmp(argv[3], "--") != 0 || argv[4][0] == '\0')
        usage("env ENV_FD -- PROGRAM ARG...");
    exec_search(argv + 4, read_environment(parse_fd(argv[2])));
    return 126;
}

int main(int argc, char **argv) {
    if (argc >= 2 && strcmp(argv[1], "enter") == 0)
        return enter(argc, argv);
    if (argc >= 2 && strcmp(argv[1], "drop") == 0)
        return drop(argc, argv);
    if (argc >= 2 && strcmp(argv[1], "env") == 0)
        return apply_env(argc, argv);
    usage("the mode is 'enter', 'drop' or 'env'");
    return 127;
}
