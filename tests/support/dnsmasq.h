/* dnsmasq -- a real DNS server for the resolver's tests: Debian's dnsmasq on 127.0.0.1, on a port
 * the kernel picked, answering for names under .test from a hosts file of its own (in a private
 * directory), with a TTL of 1 s and NXDOMAIN for any other .test name. It runs as the current
 * user (root in CI: told to stay root, so that it can read the private directory) and dies with
 * the test process (PR_SET_PDEATHSIG, and an atexit() for every one still running), so that no
 * dnsmasq outlives a test, even a failing or crashing one. No Criterion here.
 */
#ifndef RETRYPROXY_TESTS_SUPPORT_DNSMASQ_H
#define RETRYPROXY_TESTS_SUPPORT_DNSMASQ_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct dnsm {
    pid_t pid;       /* 0 once killed */
    uint16_t port;   /* UDP and TCP on 127.0.0.1 */
    char server[32]; /* "127.0.0.1:PORT", as resolver.servers takes it */
    char dir[64];    /* the private directory: hosts, log */
    char hosts[96];
    struct {
        char name[64];
        char (*addrs)[48]; /* n of them, on the heap: a name may have hundreds */
        size_t n;
    } names[16]; /* what the hosts file holds */
    size_t nnames;
};

/* A running dnsmasq with an empty hosts file, answering; NULL (with a message on stderr) if it
 * could not be started within a few tries. From the test's main thread: it dies with the
 * thread that started it. */
struct dnsm *dnsm_start(void);
/* Gives 'name' the addresses addrs[0..n) (IPv4 or IPv6 text; n 0: none, so NXDOMAIN; any
 * number: an answer past 512 bytes goes over TCP), and waits until the server answers that set
 * (at most 5 s). 0, or -1. Other names keep theirs. */
int dnsm_set(struct dnsm *d, const char *name, const char *const *addrs, size_t n);
/* SIGKILL: its port refuses from now on. */
void dnsm_kill(struct dnsm *d);
/* SIGSTOP / SIGCONT: queries go unanswered (they time out) until thawed. */
void dnsm_freeze(struct dnsm *d);
void dnsm_thaw(struct dnsm *d);
/* Kills it if it runs, removes its directory, frees 'd'. Accepts NULL. */
void dnsm_stop(struct dnsm *d);

/* The addresses the server at 'server' ("IP:PORT") gives 'name' (A and AAAA), as sorted text
 * joined by ',' into out[cap] ("" for none; cut at 'cap'); the c-ares status (ARES_SUCCESS...). */
int dnsm_query(const char *server, const char *name, char *out, size_t cap);

#endif
