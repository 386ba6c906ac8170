/*
 * accelshare-exec: how a process-runtime kernel's command is started, without Python.
 *
 * Built by the agent at start (accelshare/agent/runtime/exec_helper.py), statically
 * where the C library allows.  One binary, five modes:
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
 *   accelshare-exec supervise STATUS_FD ENV_FD --launch FILE --proc-file FILE
 *                   --exit-file FILE [--bwrap N [--session-group] [--outbound SLIRP4NETNS]]
 *                   [enter's options] -- PROGRAM ARG...
 *
 *     The kernel's supervisor, started by the launcher's fork server with posix_spawn
 *     (its own session, every signal's default, a fixed environment, its output to the
 *     kernel's launcher.log): what _launcher.py's supervise() does.  It forks the
 *     kernel's process, which goes on as enter does (setsid first; ENV_FD holds the
 *     environment it execs with), its failure read back from a close-on-exec pipe.
 *     With --bwrap N the command's first N words are bwrap and its options: the helper
 *     inserts --info-fd (and, with --outbound, --block-fd) after them, reads the
 *     sandbox's pid from bwrap's info ("child-pid": N), and with --outbound starts
 *     SLIRP4NETNS in the kernel's cgroups (--enable-sandbox --enable-seccomp as root,
 *     --userns-path otherwise; ready within 10 s or the start fails) and then releases
 *     bwrap.  It writes the proc file (pids, start times, the sandbox's pid and start
 *     time, "sandbox_group" with --session-group), reports {"ok": true, ...} on
 *     STATUS_FD, ignores SIGTERM/SIGINT/SIGHUP, waits for the kernel, kills what is left
 *     of its process group (and the sandbox's init if its start time still matches),
 *     stops slirp4netns and writes the exit file (bwrap's 128 + N read as signal N).  A
 *     failed start writes the exit file ("failed" and the error) and reports
 *     {"ok": false, "error": ...}; the helper then exits 1.  Both files are written
 *     through a temporary file and a rename; strings are JSON-escaped.  --launch only
 *     names the kernel's launch.json in its command line (the agent finds its kernels'
 *     supervisors by it).
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
 *
 *   accelshare-exec socket NETNS_FD USERNS_FD SOCK_FD
 *
 *     A TCP socket of another network namespace, for an agent that is not root
 *     (netns_forward.py: a sandboxed kernel's app ports): the helper, single-threaded,
 *     enters USERNS_FD (the user namespace owning the network namespace, unless it is
 *     already in it), then NETNS_FD, creates an unconnected AF_INET/SOCK_STREAM socket
 *     there and sends it over SOCK_FD (a unix socket) with SCM_RIGHTS; exit code 0.  A
 *     failure is written to SOCK_FD instead, as Python's "TypeName: message", and the
 *     exit code is 1.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <linux/capability.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef NS_GET_USERNS
#define NS_GET_USERNS _IO(0xb7, 0x1) /* <linux/nsfs.h>: a namespace's owning user namespace */
#endif

#ifndef PR_CAP_AMBIENT
#define PR_CAP_AMBIENT 47
#define PR_CAP_AMBIENT_CLEAR_ALL 4
#endif

#define MAX_LIST 256

static int err_fd = -1;
/* supervise mode, in the supervisor: its failures end the start (exit.json, status). */
static const char *failing_exit_file = NULL;
static int fail_start(const char *exit_file, const char *error, size_t len);

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
    } else if (failing_exit_file != NULL) {
        fail_start(failing_exit_file, message, strlen(message));
        _exit(1);
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

/* The kernel's limits and how it is started: enter's options (also supervise's). */
struct kernel_options {
    const char *procs[MAX_LIST], *log_file, *cwd, *cpus;
    int procs_count, keep[MAX_LIST + 2], keep_count;
    int resources[MAX_LIST], limit_count;
    rlim_t soft[MAX_LIST], hard[MAX_LIST];
};

/* One of enter's options at argv[*i] (its values consumed): 1, or 0 when it is none. */
static int kernel_option(struct kernel_options *o, int argc, char **argv, int *i) {
    const char *option = argv[*i];
    int left = argc - *i - 1;
    if (strcmp(option, "--procs") == 0 && left >= 1) {
        if (o->procs_count == MAX_LIST)
            usage("too many --procs");
        o->procs[o->procs_count++] = argv[++*i];
    } else if (strcmp(option, "--rlimit") == 0 && left >= 3) {
        if (o->limit_count == MAX_LIST)
            usage("too many --rlimit");
        o->resources[o->limit_count] = limit_resource(argv[*i + 1]);
        o->soft[o->limit_count] = limit_value(argv[*i + 2]);
        o->hard[o->limit_count] = limit_value(argv[*i + 3]);
        o->limit_count++;
        *i += 3;
    } else if (strcmp(option, "--cpus") == 0 && left >= 1) {
        o->cpus = argv[++*i];
    } else if (strcmp(option, "--keep-fd") == 0 && left >= 1) {
        if (o->keep_count >= MAX_LIST)
            usage("too many --keep-fd");
        o->keep[o->keep_count++] = parse_fd(argv[++*i]);
    } else if (strcmp(option, "--log") == 0 && left >= 1) {
        o->log_file = argv[++*i];
    } else if (strcmp(option, "--cwd") == 0 && left >= 1) {
        o->cwd = argv[++*i];
    } else {
        return 0;
    }
    return 1;
}

/* Join the kernel's cgroups, set its rlimits and CPU affinity (the kernel's process and
 * the sandbox's slirp4netns); a failure is fail()ed. */
static void enter_limits(const struct kernel_options *o) {
    for (int k = 0; k < o->procs_count; k++)
        write_pid(o->procs[k]);
    for (int k = 0; k < o->limit_count; k++) {
        struct rlimit limit = {o->soft[k], o->hard[k]};
        if (setrlimit(o->resources[k], &limit) != 0) {
            if (errno == EPERM)
                fail(127, "ValueError", "not allowed to raise maximum limit");
            if (errno == EINVAL)
                fail(127, "ValueError", "current limit exceeds maximum limit");
            fail_os(127, errno, NULL);
        }
    }
    if (o->cpus != NULL)
        set_affinity(o->cpus);
}

/* The kernel's process from its environment on env_fd to the exec of command. */
static void enter_kernel(const struct kernel_options *o, int env_fd, char **command) {
    char **env = read_environment(env_fd);
    enter_limits(o);
    int stdin_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (stdin_fd < 0)
        fail_os(127, errno, "/dev/null");
    int log_fd = open(o->log_file, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (log_fd < 0)
        fail_os(127, errno, o->log_file);
    if (dup2(stdin_fd, 0) < 0 || dup2(log_fd, 1) < 0 || dup2(log_fd, 2) < 0)
        fail_os(127, errno, NULL);
    if (chdir(o->cwd) != 0)
        fail_os(127, errno, o->cwd);
    close_others(o->keep, o->keep_count);
    exec_search(command, env);
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
    static struct kernel_options o;
    int i = 4;
    for (; i < argc; i++) {
        if (strcmp(argv[i], "--") == 0) {
            i++;
            break;
        }
        if (!kernel_option(&o, argc, argv, &i))
            usage("unknown option, or one without its value");
    }
    if (o.log_file == NULL || o.cwd == NULL)
        usage("--log and --cwd are required");
    if (i >= argc || argv[i][0] == '\0')
        usage("no PROGRAM after --");
    enter_kernel(&o, env_fd, argv + i);
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

/*
 * socket NETNS_FD USERNS_FD SOCK_FD
 */
static int make_socket(int argc, char **argv) {
    if (argc != 5)
        usage("socket NETNS_FD USERNS_FD SOCK_FD");
    int sock_fd = parse_fd(argv[4]);
    if (fcntl(sock_fd, F_SETFD, FD_CLOEXEC) != 0)
        fail_os(1, errno, NULL);
    err_fd = sock_fd; /* (from here on, failures go to the agent) */
    int net_fd = parse_fd(argv[2]), user_fd = parse_fd(argv[3]);
    struct stat target, own;
    if (fstat(user_fd, &target) != 0)
        fail_os(1, errno, NULL);
    /* (setns into the user namespace it is already in fails: skipped) */
    if (stat("/proc/self/ns/user", &own) != 0 || own.st_dev != target.st_dev ||
        own.st_ino != target.st_ino) {
        if (setns(user_fd, CLONE_NEWUSER) != 0) {
            int e = errno;
            fail(1, error_type(e), "[Errno %d] %s (entering the user namespace that owns it)",
                 e, strerror(e));
        }
    }
    if (setns(net_fd, CLONE_NEWNET) != 0) {
        int e = errno;
        fail(1, error_type(e), "[Errno %d] %s (entering it)", e, strerror(e));
    }
    int made = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (made < 0)
        fail_os(1, errno, NULL);
    char byte = 0;
    struct iovec data = {&byte, 1};
    union {
        struct cmsghdr align;
        char space[CMSG_SPACE(sizeof(int))];
    } control;
    memset(&control, 0, sizeof control);
    struct msghdr message = {0};
    message.msg_iov = &data;
    message.msg_iovlen = 1;
    message.msg_control = control.space;
    message.msg_controllen = sizeof control.space;
    struct cmsghdr *header = CMSG_FIRSTHDR(&message);
    header->cmsg_level = SOL_SOCKET;
    header->cmsg_type = SCM_RIGHTS;
    header->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(header), &made, sizeof made);
    ssize_t sent;
    do
        sent = sendmsg(sock_fd, &message, MSG_NOSIGNAL);
    while (sent < 0 && errno == EINTR);
    if (sent < 0)
        fail_os(1, errno, NULL);
    return 0;
}

/* -- supervise mode ------------------------------------------------------------------ */

/* A growing text buffer (JSON records, error texts); out of memory ends the process. */
struct text {
    char *data;
    size_t len, cap;
};

static void text_add(struct text *t, const char *data, size_t len) {
    if (t->len + len + 1 > t->cap) {
        size_t cap = t->cap ? t->cap : 256;
        while (cap < t->len + len + 1)
            cap *= 2;
        char *grown = realloc(t->data, cap);
        if (grown == NULL)
            _exit(1);
        t->data = grown;
        t->cap = cap;
    }
    memcpy(t->data + t->len, data, len);
    t->len += len;
    t->data[t->len] = '\0';
}

static void text_str(struct text *t, const char *s) { text_add(t, s, strlen(s)); }

static void text_printf(struct text *t, const char *format, ...) {
    char buf[512];
    va_list args;
    va_start(args, format);
    int n = vsnprintf(buf, sizeof buf, format, args);
    va_end(args);
    if (n > 0)
        text_add(t, buf, (size_t)n < sizeof buf ? (size_t)n : sizeof buf - 1);
}

/* The length of the valid UTF-8 sequence at s (at most left bytes), 0 if there is none. */
static size_t utf8_sequence(const unsigned char *s, size_t left) {
    unsigned char c = s[0];
    size_t n;
    unsigned int low = 0x80, high = 0xbf; /* the second byte's range */
    if (c < 0x80)
        return 1;
    if (c >= 0xc2 && c <= 0xdf)
        n = 2;
    else if (c >= 0xe0 && c <= 0xef) {
        n = 3;
        if (c == 0xe0)
            low = 0xa0;
        if (c == 0xed)
            high = 0x9f; /* (no surrogates) */
    } else if (c >= 0xf0 && c <= 0xf4) {
        n = 4;
        if (c == 0xf0)
            low = 0x90;
        if (c == 0xf4)
            high = 0x8f;
    } else
        return 0;
    if (left < n || s[1] < low || s[1] > high)
        return 0;
    for (size_t k = 2; k < n; k++)
        if (s[k] < 0x80 || s[k] > 0xbf)
            return 0;
    return n;
}

/* data as a JSON string: escaped, each byte that is not UTF-8 read as U+FFFD (as
 * Python's decode(errors="replace") reads it). */
static void text_json_string(struct text *t, const char *data, size_t len) {
    const unsigned char *s = (const unsigned char *)data;
    text_add(t, "\"", 1);
    for (size_t i = 0; i < len;) {
        unsigned char c = s[i];
        if (c == '"' || c == '\\') {
            char escaped[2] = {'\\', (char)c};
            text_add(t, escaped, 2);
            i++;
        } else if (c < 0x20 || c == 0x7f) {
            text_printf(t, "\\u%04x", c);
            i++;
        } else {
            size_t n = utf8_sequence(s + i, len - i);
            if (n == 0) {
                text_str(t, "\\ufffd");
                i++;
            } else {
                text_add(t, data + i, n);
                i += n;
            }
        }
    }
    text_add(t, "\"", 1);
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* A process's start time (clock ticks after boot: /proc/PID/stat's 22nd field), -1 when
 * it cannot be read (written as null). */
static long long start_ticks(pid_t pid) {
    char path[64], buf[4096];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return -1;
    buf[n] = '\0';
    char *p = strrchr(buf, ')');
    if (p == NULL)
        return -1;
    p++;
    for (int field = 0; field < 20; field++) { /* fields 3 .. 22 after the name */
        while (*p == ' ')
            p++;
        if (*p == '\0')
            return -1;
        if (field == 19) {
            char *end;
            errno = 0;
            long long ticks = strtoll(p, &end, 10);
            return errno == 0 && end != p && (*end == ' ' || *end == '\n' || *end == '\0')
                       ? ticks
                       : -1;
        }
        while (*p != ' ' && *p != '\0')
            p++;
    }
    return -1;
}

static void text_ticks(struct text *t, long long ticks) {
    if (ticks < 0)
        text_str(t, "null");
    else
        text_printf(t, "%lld", ticks);
}

/* Write text to path through a temporary file and a rename (as _launcher.py does). */
static void write_atomic(const char *path, const struct text *t) {
    struct text tmp = {0};
    text_printf(&tmp, "%s", ""); /* (allocated) */
    text_str(&tmp, path);
    text_printf(&tmp, ".%d.tmp", (int)getpid());
    int fd = open(tmp.data, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    int ok = fd >= 0;
    if (ok) {
        size_t done = 0;
        while (done < t->len) {
            ssize_t n = write(fd, t->data + done, t->len - done);
            if (n < 0 && errno == EINTR)
                continue;
            if (n <= 0) {
                ok = 0;
                break;
            }
            done += (size_t)n;
        }
        if (close(fd) != 0)
            ok = 0;
    }
    if (!ok || rename(tmp.data, path) != 0) {
        int e = errno;
        dprintf(2, "accelshare-exec supervise: cannot write %s: %s\n", path, strerror(e));
        unlink(tmp.data);
    }
    free(tmp.data);
}

static int status_fd = -1;

/* The one status line to the agent (whose pipe may be gone: proc.json / exit.json tell
 * the next agent), then the status pipe is closed. */
static void report(const struct text *t) {
    if (status_fd < 0)
        return;
    write_all(status_fd, t->data, t->len);
    close(status_fd);
    status_fd = -1;
}

/* A start that failed: exit.json says why, so does the status line; exit code 1. */
static int fail_start(const char *exit_file, const char *error, size_t len) {
    struct text record = {0}, status = {0};
    text_str(&record, "{\"error\": ");
    text_json_string(&record, error, len);
    text_printf(&record, ", \"exit_code\": null, \"finished_at\": %.6f, \"reason\": \"failed\"}\n",
                now());
    write_atomic(exit_file, &record);
    text_str(&status, "{\"ok\": false, \"error\": ");
    text_json_string(&status, error, len);
    text_str(&status, "}\n");
    report(&status);
    free(record.data);
    free(status.data);
    return 1;
}

/* "[Errno N] text", as Python's str() of an OSError words it. */
static void text_os_error(struct text *t, int e) { text_printf(t, "[Errno %d] %s", e, strerror(e)); }

/* Everything from fd up to EOF (fd is closed). */
static void read_all(int fd, struct text *t) {
    char buf[65536];
    text_add(t, "", 0);
    for (;;) {
        ssize_t n = read(fd, buf, sizeof buf);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        text_add(t, buf, (size_t)n);
    }
    close(fd);
}

static int wait_for(pid_t pid) {
    int status = 0;
    while (waitpid(pid, &status, 0) < 0) {
        if (errno != EINTR)
            return -1;
    }
    return status;
}

/* Python's os.waitstatus_to_exitcode: the exit code, or -N for a kill by signal N. */
static int exit_code_of(int status) {
    if (WIFSIGNALED(status))
        return -WTERMSIG(status);
    return WEXITSTATUS(status);
}

/* The sandbox's pid from bwrap's --info-fd JSON ("child-pid": N), 0 without one. */
static pid_t sandbox_pid_of(const char *info) {
    const char *key = strstr(info, "\"child-pid\"");
    if (key == NULL)
        return 0;
    const char *p = key + strlen("\"child-pid\"");
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')
        p++;
    if (*p++ != ':')
        return 0;
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')
        p++;
    if (*p < '1' || *p > '9')
        return 0;
    char *end;
    errno = 0;
    long long pid = strtoll(p, &end, 10);
    if (errno != 0 || pid <= 0 || pid > INT_MAX ||
        !(*end == ',' || *end == '}' || *end == ' ' || *end == '\n' || *end == '\r' || *end == '\t'))
        return 0;
    return (pid_t)pid;
}

/* The end of the kernel's log (its last 600 bytes, surrounding white space stripped). */
static void log_tail(const char *path, struct text *t) {
    char buf[600];
    text_add(t, "", 0);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    off_t end = lseek(fd, 0, SEEK_END);
    ssize_t n = -1;
    if (end >= 0 && lseek(fd, end > (off_t)sizeof buf ? end - (off_t)sizeof buf : 0, SEEK_SET) >= 0)
        n = read(fd, buf, sizeof buf);
    close(fd);
    if (n <= 0)
        return;
    size_t from = 0, to = (size_t)n;
#define BLANK(c) ((c) == ' ' || ((c) >= '\t' && (c) <= '\r') || ((c) >= 0x1c && (c) <= 0x1f))
    while (from < to && BLANK(buf[from]))
        from++;
    while (to > from && BLANK(buf[to - 1]))
        to--;
#undef BLANK
    text_add(t, buf + from, to - from);
}

/* Every signal's default disposition and none blocked (a child before its exec). */
static void default_signals(void) {
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    for (int signum = 1; signum < NSIG; signum++)
        if (signum != SIGKILL && signum != SIGSTOP)
            sigaction(signum, &dfl, NULL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
}

#define NETWORK_READY_S 10

/* Outbound networking for the sandbox (_launcher.py's _start_network): slirp4netns in
 * the kernel's cgroups attached to the sandbox's network namespace.  Returns its pid
 * and sets *exit_w (closing it ends slirp4netns), or 0 with the reason in why. */
static pid_t start_network(const char *slirp, pid_t sandbox_pid, const struct kernel_options *o,
                           int *exit_w, struct text *why) {
    int ready[2], ends[2];
    if (pipe2(ready, O_CLOEXEC) != 0) {
        text_os_error(why, errno);
        return 0;
    }
    if (pipe2(ends, O_CLOEXEC) != 0) {
        text_os_error(why, errno);
        close(ready[0]);
        close(ready[1]);
        return 0;
    }
    /* Not root: slirp4netns joins the user namespace that owns the sandbox's network
     * namespace, named by a descriptor of it (/proc/self/fd/N in slirp4netns), never
     * /proc/PID/ns/user: with --disable-userns bwrap's init moves on into a nested user
     * namespace while it sets the sandbox up, in which the network namespace cannot be
     * entered. */
    int userns_fd = -1;
    if (geteuid() != 0) {
        char net_path[64];
        snprintf(net_path, sizeof net_path, "/proc/%d/ns/net", (int)sandbox_pid);
        int net_fd = open(net_path, O_RDONLY | O_CLOEXEC), error = errno;
        if (net_fd >= 0) {
            userns_fd = ioctl(net_fd, NS_GET_USERNS);
            error = errno;
            close(net_fd);
        }
        if (userns_fd < 0) {
            text_printf(why, "the sandbox's user namespace: %s", strerror(error));
            close(ready[0]);
            close(ready[1]);
            close(ends[0]);
            close(ends[1]);
            return 0;
        }
    }
    char ready_arg[48], exit_arg[48], pid_arg[24], userns_arg[64];
    snprintf(ready_arg, sizeof ready_arg, "--ready-fd=%d", ready[1]);
    snprintf(exit_arg, sizeof exit_arg, "--exit-fd=%d", ends[0]);
    snprintf(pid_arg, sizeof pid_arg, "%d", (int)sandbox_pid);
    snprintf(userns_arg, sizeof userns_arg, "--userns-path=/proc/self/fd/%d", userns_fd);
    const char *argv[12];
    int argc = 0;
    argv[argc++] = slirp;
    argv[argc++] = "--configure";
    argv[argc++] = "--mtu=65520";
    argv[argc++] = "--disable-host-loopback";
    argv[argc++] = ready_arg;
    argv[argc++] = exit_arg;
    if (geteuid() == 0) {
        argv[argc++] = "--enable-sandbox";
        argv[argc++] = "--enable-seccomp";
    } else {
        argv[argc++] = userns_arg;
    }
    argv[argc++] = pid_arg;
    argv[argc++] = "tap0";
    argv[argc] = NULL;
    pid_t pid = fork();
    if (pid < 0) {
        text_os_error(why, errno);
        close(ready[0]);
        close(ready[1]);
        close(ends[0]);
        close(ends[1]);
        if (userns_fd >= 0)
            close(userns_fd);
        return 0;
    }
    if (pid == 0) {
        failing_exit_file = NULL; /* (a failure here: to the launcher log, exit 127) */
        default_signals();
        if (fcntl(ready[1], F_SETFD, 0) != 0 || fcntl(ends[0], F_SETFD, 0) != 0)
            _exit(127);
        if (userns_fd >= 0 && fcntl(userns_fd, F_SETFD, 0) != 0)
            _exit(127);
        enter_limits(o); /* (a failure: to the launcher log, exit 127) */
        execv(slirp, (char **)argv);
        _exit(127);
    }
    close(ready[1]);
    close(ends[0]);
    if (userns_fd >= 0)
        close(userns_fd);
    char buf[16];
    ssize_t n = 0;
    double deadline = now() + NETWORK_READY_S;
    for (;;) {
        double left = deadline - now();
        if (left <= 0)
            break;
        struct pollfd wait_ready = {ready[0], POLLIN, 0};
        int polled = poll(&wait_ready, 1, (int)(left * 1000) + 1);
        if (polled < 0 && errno == EINTR)
            continue;
        if (polled > 0) {
            do
                n = read(ready[0], buf, sizeof buf);
            while (n < 0 && errno == EINTR);
        }
        break;
    }
    close(ready[0]);
    if (n <= 0) {
        close(ends[1]);
        kill(pid, SIGKILL);
        wait_for(pid);
        text_printf(why, "slirp4netns did not set up the sandbox's network within %d s",
                    NETWORK_READY_S);
        return 0;
    }
    *exit_w = ends[1];
    return pid;
}

/*
 * supervise STATUS_FD ENV_FD --launch FILE --proc-file FILE --exit-file FILE
 *           [--bwrap N [--session-group] [--outbound SLIRP4NETNS]] [enter's options]
 *           -- PROGRAM ARG...
 */
static int supervise(int argc, char **argv) {
    if (argc < 4)
        usage("supervise STATUS_FD ENV_FD ... -- PROGRAM ARG...");
    status_fd = parse_fd(argv[2]);
    for (int k = 4; k + 1 < argc && strcmp(argv[k], "--") != 0; k++)
        if (strcmp(argv[k], "--exit-file") == 0)
            failing_exit_file = argv[k + 1];
    int env_fd = parse_fd(argv[3]);
    static struct kernel_options o;
    const char *proc_file = NULL, *exit_file = NULL, *slirp = NULL;
    int bwrap_words = 0, session_group = 0;
    int i = 4;
    for (; i < argc; i++) {
        const char *option = argv[i];
        int left = argc - i - 1;
        if (strcmp(option, "--") == 0) {
            i++;
            break;
        } else if (strcmp(option, "--launch") == 0 && left >= 1) {
            i++; /* (names the kernel in this process's command line: procfs.py) */
        } else if (strcmp(option, "--proc-file") == 0 && left >= 1) {
            proc_file = argv[++i];
        } else if (strcmp(option, "--exit-file") == 0 && left >= 1) {
            exit_file = argv[++i];
        } else if (strcmp(option, "--bwrap") == 0 && left >= 1) {
            bwrap_words = (int)parse_number(argv[++i], 1, INT_MAX, "bad --bwrap count");
        } else if (strcmp(option, "--session-group") == 0) {
            session_group = 1;
        } else if (strcmp(option, "--outbound") == 0 && left >= 1) {
            slirp = argv[++i];
        } else if (!kernel_option(&o, argc, argv, &i)) {
            usage("unknown option, or one without its value");
        }
    }
    if (o.log_file == NULL || o.cwd == NULL || proc_file == NULL || exit_file == NULL)
        usage("--log, --cwd, --proc-file and --exit-file are required");
    if (i >= argc || argv[i][0] == '\0')
        usage("no PROGRAM after --");
    char **command = argv + i;
    int command_count = argc - i;
    if (bwrap_words > command_count)
        usage("--bwrap counts more words than the command has");
    if (slirp != NULL && bwrap_words == 0)
        usage("--outbound without --bwrap");
    int sandboxed = bwrap_words > 0, outbound = slirp != NULL;
    /* (descriptors for the kernel's process only: the kept ones lose it there) */
    fcntl(status_fd, F_SETFD, FD_CLOEXEC);
    fcntl(env_fd, F_SETFD, FD_CLOEXEC);
    for (int k = 0; k < o.keep_count; k++)
        fcntl(o.keep[k], F_SETFD, FD_CLOEXEC);

    int err[2] = {-1, -1}, info[2] = {-1, -1}, block[2] = {-1, -1};
    struct text why = {0};
    if (pipe2(err, O_CLOEXEC) != 0 || (sandboxed && pipe2(info, O_CLOEXEC) != 0) ||
        (outbound && pipe2(block, O_CLOEXEC) != 0)) {
        text_str(&why, error_type(errno));
        text_str(&why, ": ");
        text_os_error(&why, errno);
        return fail_start(exit_file, why.data, why.len);
    }
    /* bwrap's command line: its info (and block) descriptor after its own options */
    char info_arg[24], block_arg[24];
    char **kernel_argv = command;
    if (sandboxed) {
        kernel_argv = calloc((size_t)command_count + 5, sizeof *kernel_argv);
        if (kernel_argv == NULL)
            _exit(1);
        int k = 0;
        for (int w = 0; w < bwrap_words; w++)
            kernel_argv[k++] = command[w];
        snprintf(info_arg, sizeof info_arg, "%d", info[1]);
        kernel_argv[k++] = "--info-fd";
        kernel_argv[k++] = info_arg;
        if (outbound) {
            snprintf(block_arg, sizeof block_arg, "%d", block[0]);
            kernel_argv[k++] = "--block-fd";
            kernel_argv[k++] = block_arg;
        }
        for (int w = bwrap_words; w < command_count; w++)
            kernel_argv[k++] = command[w];
        kernel_argv[k] = NULL;
        o.keep[o.keep_count++] = info[1];
        if (outbound)
            o.keep[o.keep_count++] = block[0];
    }
    pid_t kernel_pid = fork();
    if (kernel_pid < 0) {
        int e = errno;
        text_str(&why, error_type(e));
        text_str(&why, ": ");
        text_os_error(&why, e);
        return fail_start(exit_file, why.data, why.len);
    }
    if (kernel_pid == 0) { /* the kernel's process: what enter does */
        close(err[0]);
        err_fd = err[1];
        if (setsid() < 0)
            fail_os(127, errno, NULL);
        enter_kernel(&o, env_fd, kernel_argv);
        _exit(127);
    }
    close(err[1]);
    close(env_fd);
    if (sandboxed)
        close(info[1]);
    if (outbound)
        close(block[0]);
    for (int k = 0; k < o.keep_count; k++)
        if (o.keep[k] != info[1] && o.keep[k] != block[0])
            close(o.keep[k]);
    struct sigaction ignore;
    memset(&ignore, 0, sizeof ignore);
    ignore.sa_handler = SIG_IGN;
    sigaction(SIGTERM, &ignore, NULL); /* stay to record the exit code */
    sigaction(SIGINT, &ignore, NULL);
    sigaction(SIGHUP, &ignore, NULL);

    struct text error = {0};
    read_all(err[0], &error);
    if (error.len > 0) {
        wait_for(kernel_pid);
        return fail_start(exit_file, error.data, error.len);
    }
    pid_t sandbox_pid = 0, network_pid = 0;
    int network_exit = -1;
    if (sandboxed) {
        struct text info_text = {0};
        read_all(info[0], &info_text);
        sandbox_pid = sandbox_pid_of(info_text.data);
        if (sandbox_pid == 0) {
            int status = wait_for(kernel_pid);
            struct text tail = {0};
            log_tail(o.log_file, &tail);
            text_str(&why, "the sandbox could not be set up: ");
            if (tail.len > 0)
                text_add(&why, tail.data, tail.len);
            else
                text_printf(&why, "exit code %d", exit_code_of(status));
            return fail_start(exit_file, why.data, why.len);
        }
        if (outbound) {
            struct text reason = {0};
            network_pid = start_network(slirp, sandbox_pid, &o, &network_exit, &reason);
            if (network_pid == 0) {
                killpg(kernel_pid, SIGKILL);
                wait_for(kernel_pid);
                text_str(&why, "the sandbox's network: ");
                text_add(&why, reason.data, reason.len);
                return fail_start(exit_file, why.data, why.len);
            }
            write_all(block[1], "1", 1); /* the command may start now */
            close(block[1]);
        }
    }
    pid_t supervisor_pid = getpid();
    long long sandbox_start = sandbox_pid ? start_ticks(sandbox_pid) : -1;
    struct text proc = {0};
    text_printf(&proc, "{\"kernel_pid\": %d, \"kernel_start\": ", (int)kernel_pid);
    text_ticks(&proc, start_ticks(kernel_pid));
    if (sandbox_pid) {
        if (session_group)
            text_str(&proc, ", \"sandbox_group\": true");
        text_printf(&proc, ", \"sandbox_pid\": %d, \"sandbox_start\": ", (int)sandbox_pid);
        text_ticks(&proc, sandbox_start);
    }
    text_printf(&proc, ", \"started_at\": %.6f, \"supervisor_pid\": %d, \"supervisor_start\": ",
                now(), (int)supervisor_pid);
    text_ticks(&proc, start_ticks(supervisor_pid));
    text_str(&proc, "}\n");
    write_atomic(proc_file, &proc);
    struct text status = {0};
    text_printf(&status, "{\"ok\": true, \"supervisor_pid\": %d, \"kernel_pid\": %d}\n",
                (int)supervisor_pid, (int)kernel_pid);
    report(&status);

    int code = exit_code_of(wait_for(kernel_pid));
    int killed_by = code < 0 ? -code : 0;
    if (sandboxed && killed_by == 0 && code > 128 && code <= 128 + 64)
        killed_by = code - 128; /* bwrap exits 128 + N when a signal N killed the command */
    killpg(kernel_pid, SIGKILL); /* the kernel has ended: so has what it left in its group */
    if (sandbox_pid && sandbox_start >= 0 && start_ticks(sandbox_pid) == sandbox_start)
        kill(sandbox_pid, SIGKILL); /* the init: its end ends the whole PID namespace */
    if (network_pid) {
        close(network_exit); /* slirp4netns ends with its exit fd */
        wait_for(network_pid);
    }
    struct text record = {0};
    if (killed_by)
        text_printf(&record, "{\"exit_code\": %d, \"finished_at\": %.6f, \"reason\": \"killed\","
                             " \"signal\": %d}\n",
                    128 + killed_by, now(), killed_by);
    else
        text_printf(&record, "{\"exit_code\": %d, \"finished_at\": %.6f, \"reason\": \"exited\","
                             " \"signal\": null}\n",
                    code, now());
    write_atomic(exit_file, &record);
    return 0;
}

int main(int argc, char **argv) {
    if (argc >= 2 && strcmp(argv[1], "enter") == 0)
        return enter(argc, argv);
    if (argc >= 2 && strcmp(argv[1], "drop") == 0)
        return drop(argc, argv);
    if (argc >= 2 && strcmp(argv[1], "env") == 0)
        return apply_env(argc, argv);
    if (argc >= 2 && strcmp(argv[1], "supervise") == 0)
        return supervise(argc, argv);
    if (argc >= 2 && strcmp(argv[1], "socket") == 0)
        return make_socket(argc, argv);
    usage("the mode is 'enter', 'supervise', 'drop', 'env' or 'socket'");
    return 127;
}
