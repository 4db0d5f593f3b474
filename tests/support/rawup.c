#include "tests/support/rawup.h"

#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tests/support/fixture.h"

/* Reads from 'c' into s->got from 'n' on, until 'until' is in it (NULL: the end or the time). */
static size_t take(int c, char *got, size_t n, size_t cap, const char *until, int timeout_ms)
{
    while (n + 1 < cap && !(until && memmem(got, n, until, strlen(until)))) {
        struct pollfd q = { c, POLLIN, 0 };
        if (poll(&q, 1, timeout_ms) <= 0)
            break;
        ssize_t k = recv(c, got + n, cap - 1 - n, 0);
        if (k <= 0)
            break;
        n += (size_t)k;
    }
    got[n] = '\0';
    return n;
}

static void *rawup_main(void *arg)
{
    struct rawup *s = arg;
    for (int c; (c = fx_accept(s->lfd, &s->stop)) >= 0;) {
        size_t n = take(c, s->got, 0, sizeof(s->got), "\r\n\r\n", 2000);
        s->served++;
        raw_send_all(c, s->resp, s->resp_len);
        shutdown(c, SHUT_WR);
        take(c, s->got, n, sizeof(s->got), NULL, s->linger_ms);
        close(c);
    }
    return NULL;
}

struct rawup *rawup_start(const char *resp, int linger_ms)
{
    struct rawup *s = calloc(1, sizeof(*s));
    s->resp = resp;
    s->resp_len = resp ? strlen(resp) : 0;
    s->linger_ms = linger_ms;
    s->lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = { .sin_family = AF_INET };
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    cr_assert(bind(s->lfd, (struct sockaddr *)&a, sizeof(a)) == 0);
    socklen_t al = sizeof(a);
    getsockname(s->lfd, (struct sockaddr *)&a, &al);
    s->port = ntohs(a.sin_port);
    listen(s->lfd, 16);
    pthread_create(&s->th, NULL, rawup_main, s);
    return s;
}

void rawup_stop(struct rawup *s)
{
    s->stop = 1;
    pthread_join(s->th, NULL);
    close(s->lfd);
    free(s);
}
