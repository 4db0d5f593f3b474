/* pgserver_hooks -- included once by a suite that runs on the run's one PostgreSQL server
 * (tests/support/pgserver.h): its runner starts the server before the tests and stops it
 * after them. A header of definitions, not declarations, because Criterion names a report
 * hook by the line it is on: a macro would put both on one line, so each suite had them
 * written out. */
#ifndef RETRYPROXY_TESTS_PGSERVER_HOOKS_H
#define RETRYPROXY_TESTS_PGSERVER_HOOKS_H

#include <criterion/criterion.h>
#include <criterion/hooks.h>

#include "tests/support/pgserver.h"

ReportHook(PRE_ALL)(struct criterion_test_set *set)
{
    (void)set;
    pgserver_run_start();
}

ReportHook(POST_ALL)(struct criterion_global_stats *st)
{
    (void)st;
    pgserver_run_stop();
}

#endif
