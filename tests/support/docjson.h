/* docjson -- the JSON examples of the documentation pages, for the suites that check a page
 * against the binary (tests/cli). */
#ifndef RETRYPROXY_TESTS_SUPPORT_DOCJSON_H
#define RETRYPROXY_TESTS_SUPPORT_DOCJSON_H

#include <jansson.h>

/* The JSON of the first ```json block after the text 'heading' in the file 'path' (a new
 * reference). Fails the test, naming the page, when there is none or it does not parse. */
json_t *docjson_block(const char *path, const char *heading);

#endif
