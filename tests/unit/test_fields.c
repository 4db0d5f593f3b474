/* The filters of proxy/http/fields.h, one per direction, for heads and trailers alike: each row is
 * tried on a head (the way up through head_up_build(), the list every attempt sends) and on a
 * trailer section, and must come out the same. */
#include <criterion/criterion.h>

#include <stdbool.h>
#include <string.h>

#include "proxy/http/fields.h"
#include "proxy/http/head.h"
#include "proxy/http/hlist.h"

/* ---- the way up ---- */

struct up_row {
    const char *name;
    const char *connection; /* the head's Connection value, NULL: none */
    bool drop_underscored, grpc;
    bool dropped;
};

static const struct up_row up_rows[] = {
    { "X-Checksum", NULL, true, true, false },
    { "x-sig-bin", NULL, true, true, false },
    { "Accept", NULL, true, false, false },
    { "Connection", NULL, false, false, true },
    { "keep-alive", NULL, false, false, true },
    { "Proxy-Connection", NULL, false, false, true },
    { "TE", NULL, false, false, true },
    { "Trailer", NULL, false, false, true },
    { "transfer-encoding", NULL, false, false, true },
    { "Upgrade", NULL, false, false, true },
    { "Host", NULL, false, false, true },
    { "Content-Length", NULL, false, false, true },
    { "Expect", NULL, false, false, true },
    { "X-Retry-Attempt", NULL, false, false, true },
    { "x-retry-max-attempts", NULL, false, false, true },
    { "X-Retry-Timeout-Ms", NULL, false, false, true },
    { "X-Forwarded-Proto", NULL, false, false, true },
    { "X-Request-Id", NULL, false, false, true },
    { "X-Deadline", NULL, false, false, true }, /* the route's deadline_header below */
    { "grpc-timeout", NULL, false, true, true },
    { "grpc-timeout", NULL, false, false, false },
    { "X_Forwarded_Proto", NULL, true, false, true },
    { "X_Forwarded_Proto", NULL, false, false, false },
    { "X-Hop", "close, X-Hop", false, false, true }, /* named by the head's Connection */
    { "x-hop", "X-Other,  X-HOP ", false, false, true },
    { "X-Hop", "X-Hops", false, false, false },
    { "X-Retry-Attempts", NULL, false, false, false }, /* a name of the way down only */
};

/* A head of two fields: the row's, and its Connection when it has one. */
struct two {
    const char *name, *connection;
};

static void two_fields(void *src, head_field_fn fn, void *arg)
{
    const struct two *t = src;
    fn(arg, t->name, strlen(t->name), "v", 1);
    if (t->connection)
        fn(arg, "Connection", 10, t->connection, strlen(t->connection));
}

/* Whether the list head_up_build() makes for such a head carries the row's field with the
 * client's value (the proxy writes X-Forwarded-Proto, X-Request-Id ... anew). */
static bool head_forwards(const struct up_row *r)
{
    struct two t = { r->name, r->connection };
    struct head_scan s;
    head_scan(&s, two_fields, &t);
    struct head_up h;
    cr_assert_eq(head_up_build(&h, &s, two_fields, &t, "", "id", false, "X-Deadline",
                               r->drop_underscored, r->grpc),
                 0);
    bool found = false;
    size_t pos = 0;
    const char *n, *v;
    while (hlist_next(&h.fields, &pos, &n, &v))
        if (strcmp(n, r->name) == 0 && strcmp(v, "v") == 0)
            found = true;
    head_up_free(&h);
    return found;
}

Test(fields, the_way_up_leaves_the_same_fields_out_of_heads_and_trailers)
{
    for (size_t i = 0; i < sizeof(up_rows) / sizeof(up_rows[0]); i++) {
        const struct up_row *r = &up_rows[i];
        const char *conn[1] = { r->connection };
        struct fields_up u = { .deadline_header = "X-Deadline",
                               .drop_underscored = r->drop_underscored,
                               .grpc = r->grpc,
                               .connection = conn,
                               .n_connection = r->connection ? 1 : 0 };
        cr_expect_eq(fields_up_drops(&u, r->name, strlen(r->name)), r->dropped, "trailer %s",
                     r->name);
        cr_expect_eq(head_forwards(r), !r->dropped, "head %s", r->name);
    }
}

Test(fields, the_way_up_leaves_pseudo_headers_and_empty_names_out)
{
    struct fields_up u = { 0 };
    cr_expect(fields_up_drops(&u, ":path", 5));
    cr_expect(fields_up_drops(&u, ":authority", 10));
    cr_expect(fields_up_drops(&u, "", 0));
    cr_expect(fields_up_drops(&u, "X-Forwarded-For", 15));
    cr_expect_not(fields_up_drops(&u, "X-Deadline", 10), "no deadline header: an ordinary field");
}

/* ---- the way down ---- */

struct down_row {
    const char *name;
    const char *head_connection, *trailer_connection; /* NULL: none */
    bool own_request_id;
    bool dropped;
};

static const struct down_row down_rows[] = {
    { "X-Checksum", NULL, NULL, true, false },
    { "grpc-status", NULL, NULL, true, false },
    { "Content-Type", NULL, NULL, true, false },
    { "Connection", NULL, NULL, false, true },
    { "Keep-Alive", NULL, NULL, false, true },
    { "proxy-connection", NULL, NULL, false, true },
    { "te", NULL, NULL, false, true },
    { "Trailer", NULL, NULL, false, true },
    { "Transfer-Encoding", NULL, NULL, false, true },
    { "upgrade", NULL, NULL, false, true },
    { "Content-Length", NULL, NULL, false, true },
    { "X-Retry-Attempts", NULL, NULL, false, true },
    { "x-retry-stop", NULL, NULL, false, true },
    { "X-Request-Id", NULL, NULL, true, true },
    { "X-Request-Id", NULL, NULL, false, false },
    { "X-Retry-Attempt", NULL, NULL, false, false }, /* a name of the way up only */
    { "Host", NULL, NULL, false, false },
    { "X-Hop", "X-Hop", NULL, false, true },
    { "x-hop", "close, X-HOP", NULL, false, true },
    { "X-Hop", "X-Hops", NULL, false, false },
};

Test(fields, the_way_down_leaves_the_same_fields_out_of_heads_and_trailers)
{
    for (size_t i = 0; i < sizeof(down_rows) / sizeof(down_rows[0]); i++) {
        const struct down_row *r = &down_rows[i];
        struct hlist head = { 0 }, trailers = { 0 };
        cr_assert_eq(hlist_add(&head, "Date", 4, "x", 1), 0);
        if (r->head_connection)
            cr_assert_eq(
                hlist_add(&head, "Connection", 10, r->head_connection, strlen(r->head_connection)),
                0);
        cr_assert_eq(hlist_add(&trailers, "X-Other", 7, "x", 1), 0);
        struct fields_down in_head = { .named = { r->head_connection ? &head : NULL },
                                       .own_request_id = r->own_request_id };
        struct fields_down in_trailers = { .named = { r->head_connection ? &head : NULL,
                                                      &trailers },
                                           .own_request_id = r->own_request_id };
        size_t nl = strlen(r->name);
        cr_expect_eq(fields_down_drops(&in_head, r->name, nl), r->dropped, "head %s", r->name);
        cr_expect_eq(fields_down_drops(&in_trailers, r->name, nl), r->dropped, "trailer %s",
                     r->name);
        hlist_free(&head);
        hlist_free(&trailers);
    }
}

/* A Connection among the trailers names trailers too (as one in the head does). */
Test(fields, the_way_down_reads_a_connection_among_the_trailers)
{
    struct hlist trailers = { 0 };
    cr_assert_eq(hlist_add(&trailers, "Connection", 10, "x-t", 3), 0);
    struct fields_down d = { .named = { NULL, &trailers } };
    cr_expect(fields_down_drops(&d, "X-T", 3));
    cr_expect_not(fields_down_drops(&d, "X-U", 3));
    cr_expect(fields_down_drops(&d, ":status", 7), "no pseudo-header among fields");
    hlist_free(&trailers);
}

/* ---- HTTP/2 ---- */

Test(fields, http2_forbids_the_connection_specific_fields_and_the_way_down_drops_them)
{
    static const struct {
        const char *name, *value;
        bool forbidden;
    } rows[] = {
        { "connection", "close", true },
        { "keep-alive", "1", true },
        { "proxy-connection", "x", true },
        { "transfer-encoding", "chunked", true },
        { "upgrade", "websocket", true },
        { "te", "gzip", true },
        { "te", "trailers", false },
        { "TE", "Trailers", false },
        { "te", "trailers, gzip", true },
        { "trailer", "x", false },
        { "host", "a", false },
        { "content-length", "1", false },
        { "x-connection", "close", false },
    };
    struct fields_down d = { 0 };
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        size_t nl = strlen(rows[i].name);
        cr_expect_eq(
            fields_h2_connection_specific(rows[i].name, nl, rows[i].value, strlen(rows[i].value)),
            rows[i].forbidden, "%s: %s", rows[i].name, rows[i].value);
        if (rows[i].forbidden)
            cr_expect(fields_down_drops(&d, rows[i].name, nl), "%s goes down", rows[i].name);
    }
}

/* Every name of the table is left out on the way its flags say, and hop-by-hop ones on both. */
static void check_named(void *arg, const char *name, unsigned ways)
{
    (*(size_t *)arg)++;
    size_t nl = strlen(name);
    struct fields_up u = { 0 };
    struct fields_down d = { .own_request_id = true };
    cr_expect_eq(fields_up_drops(&u, name, nl), (ways & FIELDS_UP) != 0, "up %s", name);
    cr_expect_eq(fields_down_drops(&d, name, nl), (ways & (FIELDS_DOWN | FIELDS_DOWN_ID)) != 0,
                 "down %s", name);
    if (ways & FIELDS_HOP)
        cr_expect((ways & FIELDS_UP) && (ways & FIELDS_DOWN), "%s", name);
    cr_expect_eq(fields_hop_by_hop(name, nl), (ways & FIELDS_HOP) != 0, "%s", name);
}

Test(fields, each_named_field_is_left_out_as_its_flags_say)
{
    size_t n = 0;
    fields_each(check_named, &n);
    cr_expect_eq(n, 18, "%zu names", n);
}
