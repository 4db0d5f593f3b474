/* Self-test of build/tests/upstream, the test upstream as a program (tests/tools/upstream.c):
 * it serves, prints its port, exits on SIGTERM and SIGINT, prints its help and refuses bad
 * arguments.
 */
#include "tests/support/tupself.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

/* A spawned tool not yet reaped: teardown kills it if an assertion cut the test short. */
static pid_t tool_pid;

static void teardown(void)
{
    if (tool_pid > 0) {
        kill(tool_pid, SIGKILL);
        waitpid(tool_pid, NULL, 0);
        tool_pid = 0;
    }
    tupself_stop();
}

TestSuite(upstream_tool, .init = tupself_start, .fini = teardown);

static void tool_path(char *out, size_t cap)
{
    const char *dir = getenv("RETRYPROXY_TOOLS");
    if (dir && *dir) {
        snprintf(out, cap, "%s/upstream", dir);
        return;
    }
    /* build/tests/integration/test_upstream_tool -> build/tests/upstream */
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    cr_assert(n > 0);
    exe[n] = '\0';
    for (int i = 0; i < 2; i++) {
        char *slash = strrchr(exe, '/');
        cr_assert(slash != NULL);
        *slash = '\0';
    }
    snprintf(out, cap, "%s/upstream", exe);
}

struct proc {
    pid_t pid;
    int out_fd;
    char err_path[64];
};

static void tool_spawn(struct proc *p, char *const argv[])
{
    char path[4200];
    tool_path(path, sizeof path);
    cr_assert(access(path, X_OK) == 0, "%s is not built", path);
    int pfd[2];
    cr_assert(pipe2(pfd, O_CLOEXEC) == 0);
    snprintf(p->err_path, sizeof p->err_path, "/tmp/tup-tool-err.XXXXXX");
    int efd = mkstemp(p->err_path);
    cr_assert(efd >= 0);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, pfd[1], 1);
    posix_spawn_file_actions_adddup2(&fa, efd, 2);
    char *args[8];
    args[0] = path;
    int i = 0;
    for (; argv[i] && i < 6; i++)
        args[i + 1] = argv[i];
    args[i + 1] = NULL;
    cr_assert_eq(posix_spawn(&p->pid, path, &fa, NULL, args, environ), 0);
    tool_pid = p->pid;
    posix_spawn_file_actions_destroy(&fa);
    close(pfd[1]);
    close(efd);
    p->out_fd = pfd[0];
}

/* Reads stdout until a newline (or EOF) within timeout_ms. */
static void read_line(int fd, char *buf, size_t cap, int timeout_ms)
{
    size_t len = 0;
    int64_t t0 = now_ns();
    while (len + 1 < cap && !memchr(buf, '\n', len)) {
        struct pollfd pfd = { .fd = fd, .events = POLLIN };
        int left = timeout_ms - (int)ms_since(t0);
        cr_assert(left > 0, "no line from the tool within %d ms", timeout_ms);
        if (poll(&pfd, 1, left) <= 0)
            continue;
        ssize_t n = read(fd, buf + len, cap - 1 - len);
        if (n <= 0)
            break;
        len += (size_t)n;
    }
    buf[len] = '\0';
}

static int wait_exit(pid_t pid, int timeout_ms)
{
    int64_t t0 = now_ns();
    int st = 0;
    pid_t r;
    while ((r = waitpid(pid, &st, WNOHANG)) == 0) {
        cr_assert(ms_since(t0) < timeout_ms, "the tool did not exit within %d ms", timeout_ms);
        usleep(10000);
    }
    cr_assert_eq(r, pid, "waitpid: %s", strerror(errno));
    tool_pid = 0;
    return st;
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "r");
    cr_assert(f != NULL);
    static char buf[65536];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

Test(upstream_tool, tool_serves_and_exits_on_sigterm, .timeout = 30)
{
    struct proc p;
    char *argv[] = { "--port", "0", "--plan", "fail=1;status=502;retry-after=3", NULL };
    tool_spawn(&p, argv);
    char line[256];
    read_line(p.out_fd, line, sizeof line, 10000);
    unsigned port = 0;
    cr_assert_eq(sscanf(line, "listening on 127.0.0.1:%u", &port), 1, "stdout: '%s'", line);
    cr_assert(port > 0 && port < 65536);

    CURL *h = curl_easy_init();
    char url[128];
    snprintf(url, sizeof url, "http://127.0.0.1:%u/tool", port);
    struct curl_slist *hl = curl_slist_append(NULL, "X-Request-Id: tool-1");
    hl = curl_slist_append(hl, "X-Retry-Attempt: 7"); /* as a proxy would count */
    struct resp r;
    long status[2];
    for (int i = 0; i < 2; i++) {
        memset(&r, 0, sizeof r);
        curl_easy_setopt(h, CURLOPT_URL, url);
        curl_easy_setopt(h, CURLOPT_PROXY, "");
        curl_easy_setopt(h, CURLOPT_HTTPHEADER, hl);
        curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
        curl_easy_setopt(h, CURLOPT_WRITEDATA, &r);
        curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
        curl_easy_setopt(h, CURLOPT_HEADERDATA, &r);
        curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 10000L);
        cr_assert_eq(curl_easy_perform(h), CURLE_OK);
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status[i]);
        if (i == 0)
            cr_assert_str_eq(r.retry_after, "3");
        resp_free(&r);
    }
    curl_slist_free_all(hl);
    curl_easy_cleanup(h);
    cr_assert_eq(status[0], 502);
    cr_assert_eq(status[1], 200);

    cr_assert_eq(kill(p.pid, SIGTERM), 0);
    int st = wait_exit(p.pid, 10000);
    close(p.out_fd);
    char *err = slurp(p.err_path);
    unlink(p.err_path);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "status %d, stderr:\n%s", st, err);
    /* each line starts with the upstream's address and shows the X-Retry-Attempt received
     * beside its own count (issue 37: two upstreams in one terminal, and attempt=N was not the
     * proxy's count) */
    char want[160];
    snprintf(want, sizeof(want),
             "127.0.0.1:%u #0 conn 1/1 GET /tool id=tool-1 X-Retry-Attempt=7 seen=1", port);
    cr_assert(strstr(err, want) && strstr(err, "-> 502"), "no '%s' in stderr:\n%s", want, err);
    snprintf(want, sizeof(want),
             "127.0.0.1:%u #1 conn 1/2 GET /tool id=tool-1 X-Retry-Attempt=7 seen=2", port);
    cr_assert(strstr(err, want) && strstr(err, "-> 200"), "no '%s' in stderr:\n%s", want, err);
}

Test(upstream_tool, tool_sigint_help_and_bad_args, .timeout = 30)
{
    struct proc p;
    char line[4096];
    char *run[] = { "--port=0", NULL };
    tool_spawn(&p, run);
    read_line(p.out_fd, line, sizeof line, 10000);
    cr_assert(strncmp(line, "listening on 127.0.0.1:", 23) == 0, "'%s'", line);
    cr_assert_eq(kill(p.pid, SIGINT), 0);
    int st = wait_exit(p.pid, 10000);
    close(p.out_fd);
    unlink(p.err_path);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "status %d", st);

    char *help[] = { "--help", NULL };
    tool_spawn(&p, help);
    read_line(p.out_fd, line, sizeof line, 10000);
    st = wait_exit(p.pid, 10000);
    close(p.out_fd);
    unlink(p.err_path);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    cr_assert(strstr(line, "usage: upstream") != NULL, "'%s'", line);

    char *bad[] = { "--plan", "fail=zz", NULL };
    tool_spawn(&p, bad);
    st = wait_exit(p.pid, 10000);
    close(p.out_fd);
    char *err = slurp(p.err_path);
    unlink(p.err_path);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 2, "status %d", st);
    cr_assert(strstr(err, "zz") != NULL, "stderr: %s", err);

    /* A port in use is a clear error, not a crash. */
    char port[16];
    snprintf(port, sizeof port, "%u", tup_port(tupself));
    char *busy[] = { "--port", port, NULL };
    tool_spawn(&p, busy);
    st = wait_exit(p.pid, 10000);
    close(p.out_fd);
    err = slurp(p.err_path);
    unlink(p.err_path);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 1, "status %d", st);
    cr_assert(strstr(err, "cannot listen") != NULL, "stderr: %s", err);
}
