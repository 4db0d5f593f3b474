/* proc -- run the built binaries from tests: spawn, capture output, wait with a deadline, look
 * at a running process in /proc. Linked into the tools (tests/tools) as well as the suites: no
 * Criterion here. */
#ifndef RETRYPROXY_TESTS_PROC_H
#define RETRYPROXY_TESTS_PROC_H

#include <curl/curl.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct proc_result {
    int status; /* exit code, or 128 + signal; -1 when it timed out (and was killed) */
    char *out;  /* everything written to stdout, NUL-terminated */
    char *err;  /* everything written to stderr */
    size_t out_len, err_len;
};

/* Path of the retryproxy binary under test: $RETRYPROXY_BIN, else build/retryproxy. */
const char *proc_bin(void);

/* Runs argv (argv[0] is the program path) with 'env_extra' ("NAME=value" strings, NULL-ended,
 * may be NULL) added to the environment, stdin from /dev/null, waiting at most 'timeout_ms'.
 * Returns 0, or -1 if it could not be started. Free with proc_result_free(). */
int proc_run(char *const argv[], char *const env_extra[], int timeout_ms, struct proc_result *r);

void proc_result_free(struct proc_result *r);

/* Appends to argv[0..n) the strings from 'a0' on until a NULL, as many as fit in 'cap' with a
 * NULL after them, which it writes; returns how many argv then holds. For a test's runner taking
 * its arguments as a NULL-ended list. */
size_t proc_args(char **argv, size_t cap, size_t n, const char *a0, va_list ap);

/* A helper process that runs until its stdin closes: argv (argv[0] the program path) with a
 * pipe as its stdin, whose first line of output (a port, say) is read into line[cap] within
 * 'timeout_ms' ("" if none came). Returns its pid, -1 if it could not be started; *in_fd is
 * its stdin's write end. proc_helper_stop() ends it. */
pid_t proc_helper_start(char *const argv[], int *in_fd, char *line, size_t cap, int timeout_ms);
/* Closes its stdin, sends SIGTERM and waits for it. */
void proc_helper_stop(pid_t pid, int in_fd);

/* The whole file at 'path' (malloc'd, NUL-terminated; "" if it cannot be read). */
char *proc_read_file(const char *path);

/* A monotonic clock in milliseconds. */
int64_t now_ms(void);
/* Sleeps 'ms' milliseconds (through signals). */
void sleep_ms(int ms);
/* rm -rf 'path', not following symlinks. */
void rm_tree(const char *path);

/* Entries of /proc/PID/'what' ("task": threads, "fd": descriptors), or -1. */
int proc_entries(pid_t pid, const char *what);
/* A "FIELD:   N kB" line of /proc/PID/status in KiB ("VmRSS": resident now, "VmHWM": its peak),
 * or -1. */
long proc_status_kb(pid_t pid, const char *field);
/* Descriptors of PID, as proc_entries(pid, "fd"), and in *to_port those of them that are TCP
 * sockets (IPv4 or IPv6) connected to remote port 'port' (/proc/PID/net/tcp*: whatever the
 * connection's state, CLOSE_WAIT included), or -1. */
int proc_fds_to_port(pid_t pid, uint16_t port, int *to_port);
/* The most bytes queued to send (tx_queue) on a TCP socket of PID's network namespace whose
 * local port is 'port' (/proc/PID/net/tcp), or -1 if the table cannot be read. */
long proc_tcp_send_queue_max(pid_t pid, uint16_t port);

/* Adds a GET of 'url' with 'headers' (the caller keeps them until the transfer is done) to 'm':
 * its body is dropped, it gives up after 'timeout_ms', and 'priv' comes back with it from
 * proc_multi_next_done(). NULL if curl could not make a handle. */
CURL *proc_multi_get(CURLM *m, const char *url, struct curl_slist *headers, long timeout_ms,
                     void *priv);
/* The next transfer of 'm' that curl_multi_info_read() reports finished, with its
 * CURLOPT_PRIVATE in *priv and its result in *rc; NULL when none is left. */
CURL *proc_multi_next_done(CURLM *m, void **priv, CURLcode *rc);

#endif
