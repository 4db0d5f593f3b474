/* promtext -- reading a value out of a Prometheus text exposition, for the tests. */
#ifndef RETRYPROXY_TESTS_SUPPORT_PROMTEXT_H
#define RETRYPROXY_TESTS_SUPPORT_PROMTEXT_H

/* The value of series 'series' ("name{a=\"x\",b=\"y\"}" or a bare name) in 'text': the sum of
 * every sample of that name carrying at least those labels with those values, in any order, as
 * a PromQL sum() of the selector would be (a series written with all its labels is that one
 * series; retryproxy_attempts_total{route="r",outcome="2xx"} sums the route's upstreams). NAN
 * if no sample matches. */
double prom_sum(const char *text, const char *series);

#endif
